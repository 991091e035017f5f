"""A/B experiments shared by every gateway on the registry: ``experiments`` (the current spec and its
version) and ``experiment_changes`` (one row per change: who, when, the spec before and after).

New tables only: nothing registered before changes.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

TIMESTAMP = sa.DateTime(timezone=True)
SPEC = sa.JSON(none_as_null=True)


def upgrade() -> None:
    op.create_table(
        "experiments",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("name", sa.String(256), nullable=False),
        sa.Column("spec", SPEC, nullable=True),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("updated_by", sa.String(256), nullable=False),
        sa.Column("updated_at", TIMESTAMP, nullable=False),
        sa.UniqueConstraint("name", name="uq_experiments_name"),
    )
    op.create_table(
        "experiment_changes",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("experiment", sa.String(256), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("action", sa.String(16), nullable=False),
        sa.Column("actor", sa.String(256), nullable=False),
        sa.Column("old_spec", SPEC, nullable=True),
        sa.Column("new_spec", SPEC, nullable=True),
        sa.Column("changed_at", TIMESTAMP, nullable=False),
        sa.UniqueConstraint("experiment", "version", name="uq_experiment_changes_version"),
        sa.CheckConstraint("action IN ('seed', 'set', 'delete')", name="ck_experiment_changes_action"),
    )


def downgrade() -> None:
    op.drop_table("experiment_changes")
    op.drop_table("experiments")
