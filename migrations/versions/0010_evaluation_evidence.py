"""evaluation_results.evidence: each eval attempt's evidence as the selection rule reads it (issue 24, chosen@k)

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-03
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("evaluation_results") as batch:
        # {"level", "publishable", "fail_to_pass", "pass_to_fail", "reproduction", "changed_lines"}; NULL for
        # results recorded before it (the report then judges them by their verdict alone).
        batch.add_column(sa.Column("evidence", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("evaluation_results") as batch:
        batch.drop_column("evidence")
