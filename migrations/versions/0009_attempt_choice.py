"""k attempts ranked (issue 24): which attempt a job published, and the question it asked instead

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("job_attempts") as batch:
        batch.add_column(sa.Column("chosen", sa.Boolean(), nullable=False, server_default=sa.false()))
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("asked_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("selection", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("extra_slots", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("extra_slots")
        batch.drop_column("selection")
        batch.drop_column("asked_at")
    with op.batch_alter_table("job_attempts") as batch:
        batch.drop_column("chosen")
