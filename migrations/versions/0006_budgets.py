"""budgets and the fair queue: why a queued job waits, and the indexes the scheduler reads

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A plain nullable column: no table copy on SQLite, so the partial unique index stays as it is.
    op.add_column("jobs", sa.Column("hold_reason", sa.Text(), nullable=True))
    op.create_index("ix_jobs_project_started", "jobs", ["forge", "project", "started_at"])
    op.create_index("ix_attempts_started", "job_attempts", ["started_at"])


def downgrade() -> None:
    op.drop_index("ix_attempts_started", table_name="job_attempts")
    op.drop_index("ix_jobs_project_started", table_name="jobs")
    op.drop_column("jobs", "hold_reason")
