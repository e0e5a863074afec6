"""what a tenant stores beside its turns (job specs and results, idempotency answers, the
conversation items no response has read): each job's bytes, and their sum per tenant

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("nbytes", sa.BigInteger, nullable=False, server_default="0"))
    op.add_column("tenant_usage", sa.Column("stored_bytes", sa.BigInteger, nullable=False, server_default="0"))
    # the jobs kept before: their stored sizes as the database measures them, summed per tenant
    pg = op.get_bind().dialect.name == "postgresql"
    size = " + ".join(f"coalesce(octet_length(CAST({c} AS TEXT)), 0)" if pg else f"coalesce(length(CAST({c} AS BLOB)), 0)"
                      for c in ("spec", "result"))
    op.execute(f"UPDATE jobs SET nbytes = {size}")
    op.execute("UPDATE tenant_usage SET stored_bytes = (SELECT coalesce(sum(j.nbytes), 0) FROM jobs j "
               "WHERE j.tenant = tenant_usage.tenant)")


def downgrade() -> None:
    op.drop_column("tenant_usage", "stored_bytes")
    op.drop_column("jobs", "nbytes")
