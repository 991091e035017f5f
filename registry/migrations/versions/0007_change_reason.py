"""Why an experiment changed: ``experiment_changes.reason``.

A change made by a guardrail (actor ``guardrail``) says which limit the arm's confidence sequence passed and
by how much; an operator's change may leave it empty. Nullable: the changes before it have none.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("experiment_changes", sa.Column("reason", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("experiment_changes", "reason")
