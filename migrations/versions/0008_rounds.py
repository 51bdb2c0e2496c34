"""review rounds: an MR's thread of jobs, and the comments and CI results that ask for rounds

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

import re

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

# A copy, not an import: a migration must not change when app code does (app/forge/api.py `mr_number_from_url`).
MR_URL_NUMBER = re.compile(r"/(?:-/)?(?:merge_requests|pulls)/([1-9][0-9]{0,9})/?$")


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("thread_id", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("round", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("round_kind", sa.String(16), nullable=True))
        batch.add_column(sa.Column("mr_number", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("start_commit", sa.String(64), nullable=True))
        batch.add_column(sa.Column("pushed_commit", sa.String(64), nullable=True))
        batch.add_column(sa.Column("round_input", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("ci_status", sa.String(32), nullable=True))
        batch.create_foreign_key("fk_jobs_thread", "jobs", ["thread_id"], ["id"], ondelete="SET NULL")
        batch.create_index("ix_jobs_thread", ["thread_id"])
        batch.create_index("ix_jobs_mr", ["forge", "project", "mr_number"])
    # Jobs that opened an MR before this migration: their MR's number, from the web URL they stored.
    conn = op.get_bind()
    rows = conn.execute(sa.text("SELECT id, mr_url FROM jobs WHERE mr_url IS NOT NULL")).fetchall()
    for job_id, url in rows:
        found = MR_URL_NUMBER.search(url or "")
        if found:
            conn.execute(
                sa.text("UPDATE jobs SET mr_number = :n WHERE id = :id"), {"n": int(found.group(1)), "id": job_id}
            )
    op.create_table(
        "round_requests",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("thread_id", sa.Integer(), sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("forge", sa.String(16), nullable=False),
        sa.Column("project", sa.String(255), nullable=False),
        sa.Column("mr_number", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("delivery_id", sa.String(255), nullable=True),
        sa.Column("dedupe_key", sa.String(255), nullable=True),
        sa.Column("author", sa.String(255), nullable=True),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.Column("job_id", sa.Integer(), sa.ForeignKey("jobs.id", ondelete="SET NULL"), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("thread_id", "kind", "dedupe_key", name="uq_round_requests_dedupe"),
    )
    op.create_index("ix_round_requests_thread", "round_requests", ["thread_id", "status"])


def downgrade() -> None:
    op.drop_index("ix_round_requests_thread", table_name="round_requests")
    op.drop_table("round_requests")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_index("ix_jobs_mr")
        batch.drop_index("ix_jobs_thread")
        batch.drop_constraint("fk_jobs_thread", type_="foreignkey")
        for name in ("ci_status", "round_input", "pushed_commit", "start_commit", "mr_number", "round_kind", "round"):
            batch.drop_column(name)
        batch.drop_column("thread_id")
