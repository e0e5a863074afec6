"""indexes for the listings (a tenant's sessions and jobs, newest first), a tenant's unfinished
jobs (its cap) and the retention of finished jobs

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_session_tenant_created", "sessions", ["tenant", "created_at"])
    op.create_index("ix_job_tenant_created", "jobs", ["tenant", "created_at"])
    op.create_index("ix_job_tenant_status", "jobs", ["tenant", "status"])
    op.create_index("ix_job_status_finished", "jobs", ["status", "finished_at"])


def downgrade() -> None:
    op.drop_index("ix_job_status_finished", "jobs")
    op.drop_index("ix_job_tenant_status", "jobs")
    op.drop_index("ix_job_tenant_created", "jobs")
    op.drop_index("ix_session_tenant_created", "sessions")
