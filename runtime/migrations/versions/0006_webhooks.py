"""webhooks: a tenant's endpoints, and the outbox of job endings to deliver to them (a partial
index on the messages still pending for the sender's scan)

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

PENDING = "delivered_at IS NULL AND failed_at IS NULL"  # as runtime/tables.py's


def upgrade() -> None:
    op.create_table(
        "webhook_endpoints",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("tenant", sa.String(128), nullable=False),
        sa.Column("url", sa.String(2048), nullable=False),
        sa.Column("secret", sa.String(64), nullable=False),
        sa.Column("events", sa.JSON, nullable=False),
        sa.Column("description", sa.String(512), nullable=False, server_default=""),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_webhook_endpoint_tenant_created", "webhook_endpoints", ["tenant", "created_at"])
    op.create_table(
        "webhook_outbox",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("tenant", sa.String(128), nullable=False),
        sa.Column("endpoint_id", sa.String(32), nullable=False),
        sa.Column("type", sa.String(64), nullable=False),
        sa.Column("payload", sa.JSON, nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("next_attempt_at", sa.Float, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("delivered_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("failed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_error", sa.String(500), nullable=False, server_default=""),
    )
    op.create_index("ix_webhook_outbox_due", "webhook_outbox", ["next_attempt_at"],
                    sqlite_where=sa.text(PENDING), postgresql_where=sa.text(PENDING))
    op.create_index("ix_webhook_outbox_endpoint", "webhook_outbox", ["endpoint_id"])
    op.create_index("ix_webhook_outbox_created", "webhook_outbox", ["created_at"])


def downgrade() -> None:
    op.drop_table("webhook_outbox")
    op.drop_table("webhook_endpoints")
