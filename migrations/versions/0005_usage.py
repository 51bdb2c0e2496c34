"""usage accounting: tokens, model calls, model and sandbox seconds per job and attempt; queue wait per job

The counts are BIGINT: a job's sums over many rounds (and a server's odd figure, before
worker/leaf/model.py clamped them) can pass int4's 2**31. The queue wait is kept twice: the
latest run's, and the total over all of the job's runs (a retry, a review round, a budget hold).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

# The figures both tables carry; jobs hold the sum over their attempts.
_COUNTS = ("prompt_tokens", "completion_tokens", "cached_tokens", "model_calls")
_SECONDS = ("model_seconds", "sandbox_seconds")


def upgrade() -> None:
    for table in ("jobs", "job_attempts"):
        with op.batch_alter_table(table) as batch:
            for name in _COUNTS:
                batch.add_column(sa.Column(name, sa.BigInteger(), nullable=False, server_default="0"))
            for name in _SECONDS:
                batch.add_column(sa.Column(name, sa.Float(), nullable=False, server_default="0"))
            if table == "jobs":
                batch.add_column(sa.Column("queue_wait_seconds", sa.Float(), nullable=True))
                batch.add_column(sa.Column("queue_wait_total_seconds", sa.Float(), nullable=True))


def downgrade() -> None:
    for table in ("job_attempts", "jobs"):
        with op.batch_alter_table(table) as batch:
            if table == "jobs":
                batch.drop_column("queue_wait_total_seconds")
                batch.drop_column("queue_wait_seconds")
            for name in reversed(_SECONDS):
                batch.drop_column(name)
            for name in reversed(_COUNTS):
                batch.drop_column(name)
