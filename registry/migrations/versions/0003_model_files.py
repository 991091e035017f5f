"""Manifests of the files that define a model: ``variants.checkpoint_files`` and ``base_models.model_files``.

Each is ``{file name: sha256}`` of the weights, config, tokenizer, generation config and chat template of the
variant's checkpoint or the base model's directory (:mod:`registry.integrity`), taken at registration and
checked before a backend is started or restarted. Both are nullable: rows registered before are checked by
their weights checksum alone until they are registered again.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("variants", sa.Column("checkpoint_files", sa.JSON(), nullable=True))
    op.add_column("base_models", sa.Column("model_files", sa.JSON(), nullable=True))


def downgrade() -> None:
    op.drop_column("base_models", "model_files")
    op.drop_column("variants", "checkpoint_files")
