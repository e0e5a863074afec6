"""jobs; turns remember the job step that wrote them

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("turns") as t:
        t.add_column(sa.Column("job_id", sa.String(32), nullable=True))
        t.add_column(sa.Column("job_step", sa.Integer, nullable=True))
    # NULLs are distinct in a unique index (SQLite and PostgreSQL): turns written outside a job
    # do not collide; one job step writes at most one turn
    op.create_index("uq_turn_job_step", "turns", ["job_id", "job_step"], unique=True)
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("tenant", sa.String(128), nullable=False, index=True),
        sa.Column("session_id", sa.String(64), sa.ForeignKey("sessions.id", ondelete="CASCADE"), nullable=True,
                  index=True),
        sa.Column("seq", sa.Integer, nullable=False),
        sa.Column("priority", sa.String(16), nullable=False),
        sa.Column("spec", sa.JSON, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("owner", sa.String(64), nullable=True),
        sa.Column("worker", sa.String(128), nullable=True),
        sa.Column("lease_until", sa.Float, nullable=False),
        sa.Column("queue", sa.String(200), nullable=False),
        sa.Column("dispatched_at", sa.Float, nullable=False),
        sa.Column("step", sa.Integer, nullable=False),
        sa.Column("progress", sa.JSON, nullable=False),
        sa.Column("result", sa.JSON, nullable=True),
        sa.Column("error", sa.JSON, nullable=True),
        sa.Column("cancel_requested", sa.Boolean, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.UniqueConstraint("session_id", "seq", name="uq_job_seq"),
    )
    op.create_index("ix_job_status_lease", "jobs", ["status", "lease_until"])


def downgrade() -> None:
    op.drop_table("jobs")
    op.drop_index("uq_turn_job_step", "turns")
    with op.batch_alter_table("turns") as t:
        t.drop_column("job_step")
        t.drop_column("job_id")
