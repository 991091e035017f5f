"""Initial schema: base models, variants, aliases, evaluations, serving benchmarks.

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

TIMESTAMP = sa.DateTime(timezone=True)


def _create_base_models() -> None:
    """Dense models that variants are pruned from."""
    op.create_table(
        "base_models",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("model", sa.String(512), nullable=False),
        sa.Column("revision", sa.String(256), nullable=True),
        sa.Column("weights_sha256", sa.String(64), nullable=False),
        sa.Column("num_blocks", sa.Integer(), nullable=False),
        sa.Column("architecture", sa.String(128), nullable=False),
        sa.Column("path", sa.Text(), nullable=True),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.Column("updated_at", TIMESTAMP, nullable=False),
        sa.UniqueConstraint("model", name="uq_base_models_model"),
    )


def _create_variants() -> None:
    """Pruned variants, one row per (base model, removed set, calibration, search)."""
    op.create_table(
        "variants",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("name", sa.String(256), nullable=False),
        sa.Column("identity", sa.String(64), nullable=False),
        sa.Column(
            "base_model_id", sa.Integer(), sa.ForeignKey("base_models.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("base_weights_sha256", sa.String(64), nullable=False),
        sa.Column("removed_blocks", sa.JSON(), nullable=False),
        sa.Column("kept_to_original", sa.JSON(), nullable=False),
        sa.Column("calibration", sa.JSON(), nullable=False),
        sa.Column("objective", sa.String(128), nullable=False),
        sa.Column("search", sa.String(128), nullable=False),
        sa.Column("search_options", sa.JSON(), nullable=False),
        sa.Column("calibration_loss", sa.Float(), nullable=True),
        sa.Column("dense_loss", sa.Float(), nullable=True),
        sa.Column("search_seconds", sa.Float(), nullable=True),
        sa.Column("block_forwards", sa.Integer(), nullable=True),
        sa.Column("subset_evaluations", sa.Integer(), nullable=True),
        sa.Column("checkpoint_path", sa.Text(), nullable=True),
        sa.Column("checkpoint_sha256", sa.String(64), nullable=True),
        sa.Column("versions", sa.JSON(), nullable=False),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.Column("updated_at", TIMESTAMP, nullable=False),
        sa.UniqueConstraint("name", name="uq_variants_name"),
        sa.UniqueConstraint("identity", name="uq_variants_identity"),
    )
    op.create_index("ix_variants_base_model_id", "variants", ["base_model_id"])
    op.create_index("ix_variants_objective", "variants", ["objective"])
    op.create_index("ix_variants_search", "variants", ["search"])


def _create_aliases() -> None:
    """Per base model names that point at a variant, or at the dense model (no variant)."""
    op.create_table(
        "aliases",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column(
            "base_model_id", sa.Integer(), sa.ForeignKey("base_models.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("alias", sa.String(256), nullable=False),
        sa.Column(
            "variant_id", sa.Integer(), sa.ForeignKey("variants.id", ondelete="CASCADE"), nullable=True
        ),
        sa.Column("updated_at", TIMESTAMP, nullable=False),
        sa.UniqueConstraint("base_model_id", "alias", name="uq_aliases_base_alias"),
    )
    op.create_index("ix_aliases_base_model_id", "aliases", ["base_model_id"])
    op.create_index("ix_aliases_alias", "aliases", ["alias"])
    op.create_index("ix_aliases_variant_id", "aliases", ["variant_id"])


def _create_evaluations() -> None:
    """One metric of one task measured on a variant or on the dense model."""
    op.create_table(
        "evaluations",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("identity", sa.String(64), nullable=False),
        sa.Column(
            "base_model_id", sa.Integer(), sa.ForeignKey("base_models.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column(
            "variant_id", sa.Integer(), sa.ForeignKey("variants.id", ondelete="CASCADE"), nullable=True
        ),
        sa.Column("suite", sa.String(128), nullable=False),
        sa.Column("task", sa.String(256), nullable=False),
        sa.Column("metric", sa.String(128), nullable=False),
        sa.Column("value", sa.Float(), nullable=False),
        sa.Column("settings", sa.JSON(), nullable=False),
        sa.Column("versions", sa.JSON(), nullable=False),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.UniqueConstraint("identity", name="uq_evaluations_identity"),
    )
    op.create_index("ix_evaluations_base_model_id", "evaluations", ["base_model_id"])
    op.create_index("ix_evaluations_variant_id", "evaluations", ["variant_id"])


def _create_serving_benchmarks() -> None:
    """Load-test runs against a served variant or the dense model."""
    op.create_table(
        "serving_benchmarks",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column(
            "base_model_id", sa.Integer(), sa.ForeignKey("base_models.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column(
            "variant_id", sa.Integer(), sa.ForeignKey("variants.id", ondelete="CASCADE"), nullable=True
        ),
        sa.Column("settings", sa.JSON(), nullable=False),
        sa.Column("metrics", sa.JSON(), nullable=False),
        sa.Column("hardware", sa.String(512), nullable=False),
        sa.Column("versions", sa.JSON(), nullable=False),
        sa.Column("created_at", TIMESTAMP, nullable=False),
    )
    op.create_index("ix_serving_benchmarks_base_model_id", "serving_benchmarks", ["base_model_id"])
    op.create_index("ix_serving_benchmarks_variant_id", "serving_benchmarks", ["variant_id"])


def upgrade() -> None:
    # In foreign-key order: every table refers to base_models, aliases and the rest to variants.
    _create_base_models()
    _create_variants()
    _create_aliases()
    _create_evaluations()
    _create_serving_benchmarks()


def downgrade() -> None:
    for table in ("serving_benchmarks", "evaluations", "aliases", "variants", "base_models"):
        op.drop_table(table)
