"""The work queue of distributed studies: ``study_cells``, one row per cell of a study grid.

``depthprune study --worker`` processes started with the same arguments (on one machine or many, sharing the
registry) claim cells from it one at a time (:mod:`registry.work_queue`). A new table only: nothing
registered before changes.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

TIMESTAMP = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "study_cells",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("study_key", sa.String(64), nullable=False),
        sa.Column("cell_key", sa.Text(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("worker", sa.String(256), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("lease_expires_at", TIMESTAMP, nullable=True),
        sa.Column(
            "variant_id", sa.Integer(), sa.ForeignKey("variants.id", ondelete="SET NULL"), nullable=True
        ),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.Column("claimed_at", TIMESTAMP, nullable=True),
        sa.Column("finished_at", TIMESTAMP, nullable=True),
        sa.UniqueConstraint("study_key", "cell_key", name="uq_study_cells_study_cell"),
        sa.CheckConstraint("state IN ('pending', 'running', 'done', 'failed')", name="ck_study_cells_state"),
    )
    op.create_index("ix_study_cells_variant_id", "study_cells", ["variant_id"])


def downgrade() -> None:
    op.drop_index("ix_study_cells_variant_id", table_name="study_cells")
    op.drop_table("study_cells")
