"""a POST's idempotency keys; schedules and their ticks (one row per (schedule, tick)); a job's schedule and tick

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "idempotency_keys",
        sa.Column("tenant", sa.String(128), primary_key=True),
        sa.Column("key", sa.String(255), primary_key=True),
        sa.Column("route", sa.String(255), nullable=False),
        sa.Column("body_hash", sa.String(64), nullable=False),
        sa.Column("status", sa.Integer, nullable=True),
        sa.Column("answer", sa.JSON, nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_idempotency_created", "idempotency_keys", ["created_at"])
    op.create_table(
        "schedules",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("tenant", sa.String(128), nullable=False),
        sa.Column("name", sa.String(128), nullable=False, server_default=""),
        sa.Column("cron", sa.String(128), nullable=False),
        sa.Column("timezone", sa.String(64), nullable=False),
        sa.Column("template", sa.JSON, nullable=False),
        sa.Column("missed", sa.String(16), nullable=False),
        sa.Column("max_catch_up", sa.Integer, nullable=False),
        sa.Column("paused", sa.Boolean, nullable=False),
        sa.Column("next_at", sa.Float, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_schedule_due", "schedules", ["paused", "next_at"])
    op.create_index("ix_schedule_tenant", "schedules", ["tenant", "created_at"])
    op.create_table(
        "schedule_ticks",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("schedule_id", sa.String(32), sa.ForeignKey("schedules.id", ondelete="CASCADE"), nullable=False),
        sa.Column("tick_at", sa.Float, nullable=False),
        sa.Column("jobs", sa.JSON, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("error", sa.String(500), nullable=False, server_default=""),
        sa.Column("claimed_at", sa.Float, nullable=False),
        sa.Column("late_s", sa.Float, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("schedule_id", "tick_at", name="uq_schedule_tick"),
    )
    op.create_index("ix_tick_status", "schedule_ticks", ["status", "claimed_at"])
    op.create_index("ix_tick_created", "schedule_ticks", ["created_at"])
    with op.batch_alter_table("jobs") as t:  # a job a schedule's tick submitted: which, and its tick
        t.add_column(sa.Column("schedule_id", sa.String(32), nullable=True))
        t.add_column(sa.Column("tick_at", sa.Float, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as t:
        t.drop_column("tick_at")
        t.drop_column("schedule_id")
    op.drop_table("schedule_ticks")
    op.drop_table("schedules")
    op.drop_table("idempotency_keys")
