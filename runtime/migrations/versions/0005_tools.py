"""a job may wait for its client's tool outputs (status requires_action): the calls it waits
for, the outputs received so far, and when the wait expires; a tenant's own datasets for the
agent's metric tool

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as t:
        t.add_column(sa.Column("action", sa.JSON(), nullable=True))
        t.add_column(sa.Column("tool_outputs", sa.JSON(), nullable=True))
        t.add_column(sa.Column("wait_until", sa.Float(), nullable=False, server_default="0"))
    op.create_table(
        "datasets",
        sa.Column("tenant", sa.String(128), primary_key=True),
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("rows", sa.JSON, nullable=False),
        sa.Column("n_rows", sa.Integer, nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("datasets")
    with op.batch_alter_table("jobs") as t:
        t.drop_column("wait_until")
        t.drop_column("tool_outputs")
        t.drop_column("action")
