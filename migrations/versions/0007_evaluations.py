"""evaluations: `manage.py eval` runs and each task attempt's result, recorded as it finishes

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "evaluations",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("model", sa.String(255), nullable=False),
        sa.Column("base_url", sa.Text(), nullable=False),
        sa.Column("selector", sa.Text(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("who", sa.String(255), nullable=True),
        sa.Column("tasks", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        # The process running it now (NULL when none): a second run is refused, a dead one's claim is taken over.
        sa.Column("runner_host", sa.String(255), nullable=True),
        sa.Column("runner_pid", sa.Integer(), nullable=True),
        sa.Column("runner_started", sa.String(32), nullable=True),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True),
        # Model slots its attempts hold now: every evaluation's count (live claims only) meets production's.
        sa.Column("slots_held", sa.Integer(), nullable=False, server_default="0"),
    )
    op.create_table(
        "evaluation_results",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column(
            "evaluation_id", sa.Integer(), sa.ForeignKey("evaluations.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("task", sa.String(160), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("solved", sa.Boolean(), nullable=False),
        sa.Column("outcome", sa.String(32), nullable=False),
        sa.Column("exit_reason", sa.String(32), nullable=True),
        sa.Column("steps", sa.Integer(), nullable=False),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("completion_tokens", sa.Integer(), nullable=False),
        sa.Column("cached_tokens", sa.Integer(), nullable=False),
        sa.Column("model_seconds", sa.Float(), nullable=False),
        sa.Column("wall_seconds", sa.Float(), nullable=False),
        sa.Column("trajectory", sa.Text(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        # The Leaf limits the attempt ran under, and whether they were the recorded job's or today's settings.
        sa.Column("limits", sa.JSON(), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("evaluation_id", "task", "attempt", name="uq_eval_results_task_attempt"),
    )


def downgrade() -> None:
    op.drop_table("evaluation_results")
    op.drop_table("evaluations")
