"""jobs.mr_state, jobs.update_checked_at: what FrogFix last saw of a thread's MR when it looked for a moved
target branch (issue 25, FROGFIX_AUTO_UPDATE); set on round-0 jobs only

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        # open, closed or merged, as the forge said at the last check; NULL: never checked.
        batch.add_column(sa.Column("mr_state", sa.String(length=16), nullable=True))
        batch.add_column(sa.Column("update_checked_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("update_checked_at")
        batch.drop_column("mr_state")
