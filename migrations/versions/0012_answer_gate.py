"""Answers only from members (issue 36): jobs.answer_waiting, a member's `/frogfix` answer that arrived
while the job's run was queued or active and runs when it ends; answer_refusals, who was told once on an
issue that their `/frogfix` starts nothing

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-09
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        # {"comment_id", "author", "member", "delivery_id", "url"}; NULL: no answer waits.
        batch.add_column(sa.Column("answer_waiting", sa.JSON(), nullable=True))
    op.create_table(
        "answer_refusals",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("forge", sa.String(16), nullable=False),
        sa.Column("project", sa.String(255), nullable=False),
        sa.Column("issue", sa.Integer(), nullable=False),
        sa.Column("author", sa.String(255), nullable=False),  # casefolded: forges compare usernames so
        sa.Column("comment_id", sa.String(64), nullable=True),  # the comment the one reply answered
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("forge", "project", "issue", "author", name="uq_answer_refusals_issue_author"),
    )


def downgrade() -> None:
    op.drop_table("answer_refusals")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("answer_waiting")
