"""sessions are bound to a model and numerics; jobs carry the pool (model and numerics) whose
workers may run them

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("sessions") as t:
        t.add_column(sa.Column("model", sa.String(64), nullable=False, server_default=""))
        t.add_column(sa.Column("numerics", sa.String(32), nullable=False, server_default=""))
    with op.batch_alter_table("jobs") as t:
        t.add_column(sa.Column("pool", sa.String(128), nullable=False, server_default=""))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as t:
        t.drop_column("pool")
    with op.batch_alter_table("sessions") as t:
        t.drop_column("numerics")
        t.drop_column("model")
