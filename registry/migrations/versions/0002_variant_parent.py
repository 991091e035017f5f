"""Lineage of healed variants: ``variants.parent_id`` (the pruned variant it was trained from) and
``variants.healing`` (how it was trained).

Both columns are nullable, so every variant registered before stays as it was (no parent, no healing).
The foreign key is written inline (``ADD COLUMN ... REFERENCES``): SQLite accepts that, whereas a separate
``ADD CONSTRAINT`` would need batch mode, which copies and drops the table, and with foreign keys on a
``DROP TABLE variants`` would cascade into the aliases, evaluations and benchmarks that point at it.
It has no ``ON DELETE`` action (SQLite does not report one declared inline, so the schema comparison could
not check it); removing a parent unlinks its healed variants first (``Registry.remove_variant``).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "variants",
        sa.Column("parent_id", sa.Integer(), sa.ForeignKey("variants.id"), nullable=True),
        inline_references=True,
    )
    op.add_column("variants", sa.Column("healing", sa.JSON(), nullable=True))
    op.create_index("ix_variants_parent_id", "variants", ["parent_id"])


def downgrade() -> None:
    # SQLite (3.35+) drops a column with an inline REFERENCES, but not one an index still covers.
    op.drop_index("ix_variants_parent_id", table_name="variants")
    op.drop_column("variants", "healing")
    op.drop_column("variants", "parent_id")
