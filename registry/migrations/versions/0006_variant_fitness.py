"""A variant's quality gate: ``variants.fit`` and ``variants.quality``.

``quality`` is what ``prune`` measured on held-out data (validation loss, held-out perplexity against the
dense model's, task accuracy against chance, the bound K); ``fit`` is its verdict, a column of its own so
that the server can refuse an unfit variant before starting any engine. Both nullable: variants registered
before the gate have no verdict (and are served as before).

Revision ID: 0006
Revises: 0004 (the experiments migration 0005 is on another branch; the integrator chains them)
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("variants", sa.Column("fit", sa.Boolean(), nullable=True))
    op.add_column("variants", sa.Column("quality", sa.JSON(), nullable=True))


def downgrade() -> None:
    op.drop_column("variants", "quality")
    op.drop_column("variants", "fit")
