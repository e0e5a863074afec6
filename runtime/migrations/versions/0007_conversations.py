"""conversations of the Responses API: a session's metadata, and the items added to it that its
next response reads

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "conversations",
        sa.Column("session_id", sa.String(64), sa.ForeignKey("sessions.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("tenant", sa.String(128), nullable=False, index=True),
        sa.Column("meta", sa.JSON, nullable=False),
        sa.Column("pending", sa.JSON, nullable=False),
        sa.Column("added", sa.Integer, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("conversations")
