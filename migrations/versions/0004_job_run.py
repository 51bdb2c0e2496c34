"""jobs.attempt is renamed run: it counts the job's runs (claims); job_attempts.number is the attempt

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A plain column rename on both databases (SQLite has had RENAME COLUMN since 3.25): no table
    # copy, so the partial unique index on active jobs is left exactly as it is.
    op.alter_column("jobs", "attempt", new_column_name="run")


def downgrade() -> None:
    op.alter_column("jobs", "run", new_column_name="attempt")
