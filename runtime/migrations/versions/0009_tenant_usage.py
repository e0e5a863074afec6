"""what a tenant holds in SQL (its sessions, its turns' bytes: its quotas' counts), each turn's
bytes, each job's planned positions, and the index the retention of idle sessions scans

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "tenant_usage",
        sa.Column("tenant", sa.String(128), primary_key=True),
        sa.Column("sessions", sa.Integer, nullable=False),
        sa.Column("turn_bytes", sa.BigInteger, nullable=False),
    )
    op.add_column("turns", sa.Column("bytes", sa.Integer, nullable=False, server_default="0"))
    op.add_column("jobs", sa.Column("positions", sa.Integer, nullable=True))  # None: planned when needed
    op.create_index("ix_session_updated", "sessions", ["updated_at"])
    # the turns written before: their stored sizes, as the database measures them (a close
    # estimate of runtime/sessions/quota.py turn_bytes); a tenant's count is their sum, so that a
    # delete takes out exactly what was counted
    pg = op.get_bind().dialect.name == "postgresql"
    size = " + ".join(f"coalesce(octet_length(CAST({c} AS TEXT)), 0)" if pg else f"coalesce(length(CAST({c} AS BLOB)), 0)"
                      for c in ("text", "token_ids", "ledger", "meta"))
    op.execute(f"UPDATE turns SET bytes = {size}")
    op.execute("INSERT INTO tenant_usage (tenant, sessions, turn_bytes) "
               "SELECT s.tenant, count(*), (SELECT coalesce(sum(t.bytes), 0) FROM turns t JOIN sessions u "
               "ON u.id = t.session_id WHERE u.tenant = s.tenant) FROM sessions s GROUP BY s.tenant")


def downgrade() -> None:
    op.drop_index("ix_session_updated", "sessions")
    op.drop_column("jobs", "positions")
    op.drop_column("turns", "bytes")
    op.drop_table("tenant_usage")
