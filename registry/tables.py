"""SQLAlchemy tables of the registry: base models, variants, aliases, evaluations, serving benchmarks, and
the cells of distributed studies (the work queue of ``depthprune study --worker``).

The schema itself is created and evolved by the Alembic migrations in ``registry/migrations``; these
classes must stay in step with them (``tests/test_registry.py`` compares the two).
Evaluations and serving benchmarks point at a base model and, for a pruned variant, at the variant:
``variant_id IS NULL`` means the dense base model itself, which is always servable as ``dense``.
A healed variant points at the pruned variant it was trained from (``variants.parent_id``).
"""

from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy import (
    JSON,
    Boolean,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship


def utc_now() -> datetime:
    """Timestamps are stored in UTC."""
    return datetime.now(timezone.utc)


def utc(moment: datetime | None) -> datetime | None:
    """A stored timestamp with its zone (UTC)."""
    # SQLite hands timestamps back without a zone; they were written in UTC.
    if moment is not None and moment.tzinfo is None:
        return moment.replace(tzinfo=timezone.utc)
    return moment


class Base(DeclarativeBase):
    """Declarative base of every registry table."""


class BaseModelRow(Base):
    """A dense model that variants were pruned from."""

    __tablename__ = "base_models"
    __table_args__ = (UniqueConstraint("model", name="uq_base_models_model"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    model: Mapped[str] = mapped_column(String(512))
    revision: Mapped[str | None] = mapped_column(String(256))
    weights_sha256: Mapped[str] = mapped_column(String(64))
    num_blocks: Mapped[int] = mapped_column(Integer)
    architecture: Mapped[str] = mapped_column(String(128))
    path: Mapped[str | None] = mapped_column(Text)
    # {file name: sha256} of the files of ``path`` that define the model (registry.integrity).
    model_files: Mapped[dict | None] = mapped_column(JSON(none_as_null=True))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utc_now)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utc_now)

    variants: Mapped[list[VariantRow]] = relationship(back_populates="base", cascade="all, delete-orphan")


class VariantRow(Base):
    """A pruned variant: which blocks went, under which calibration configuration and search; for a healed
    variant also its parent and how it was healed."""

    __tablename__ = "variants"
    __table_args__ = (
        UniqueConstraint("name", name="uq_variants_name"),
        UniqueConstraint("identity", name="uq_variants_identity"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(256))
    # sha256 of (base, removed set, calibration, search), plus the parent and the healing settings for a
    # healed variant: registering the same again updates this row.
    identity: Mapped[str] = mapped_column(String(64))
    base_model_id: Mapped[int] = mapped_column(ForeignKey("base_models.id", ondelete="CASCADE"), index=True)
    base_weights_sha256: Mapped[str] = mapped_column(String(64))
    removed_blocks: Mapped[list] = mapped_column(JSON)
    kept_to_original: Mapped[list] = mapped_column(JSON)
    calibration: Mapped[dict] = mapped_column(JSON)
    objective: Mapped[str] = mapped_column(String(128), index=True)
    search: Mapped[str] = mapped_column(String(128), index=True)
    search_options: Mapped[dict] = mapped_column(JSON)
    calibration_loss: Mapped[float | None] = mapped_column(Float)
    dense_loss: Mapped[float | None] = mapped_column(Float)
    search_seconds: Mapped[float | None] = mapped_column(Float)
    block_forwards: Mapped[int | None] = mapped_column(Integer)
    subset_evaluations: Mapped[int | None] = mapped_column(Integer)
    checkpoint_path: Mapped[str | None] = mapped_column(Text)
    checkpoint_sha256: Mapped[str | None] = mapped_column(String(64))
    # {file name: sha256} of the checkpoint's files that define the model (registry.integrity).
    checkpoint_files: Mapped[dict | None] = mapped_column(JSON(none_as_null=True))
    versions: Mapped[dict] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utc_now)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utc_now)
    # No ON DELETE action: SQLite does not report one declared inline, so the schema comparison could not
    # see it. Registry.remove_variant unlinks the children first: a healed variant outlives its parent.
    parent_id: Mapped[int | None] = mapped_column(ForeignKey("variants.id"), index=True)
    healing: Mapped[dict | None] = mapped_column(JSON(none_as_null=True))
    # The quality gate (migration 0006): what prune measured on held-out data, and its verdict.
    quality: Mapped[dict | None] = mapped_column(JSON(none_as_null=True))
    fit: Mapped[bool | None] = mapped_column(Boolean)

    base: Mapped[BaseModelRow] = relationship(back_populates="variants")


class AliasRow(Base):
    """A stable name (``ppl-best``) for a variant of one base model; no variant means the dense model."""

    __tablename__ = "aliases"
    __table_args__ = (UniqueConstraint("base_model_id", "alias", name="uq_aliases_base_alias"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    base_model_id: Mapped[int] = mapped_column(ForeignKey("base_models.id", ondelete="CASCADE"), index=True)
    alias: Mapped[str] = mapped_column(String(256), index=True)
    variant_id: Mapped[int | None] = mapped_column(ForeignKey("variants.id", ondelete="CASCADE"), index=True)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utc_now)


class EvaluationRow(Base):
    """One metric of one task, e.g. ``ppl``/``wikitext2``/``perplexity`` or ``lm-eval``/``piqa``/``acc``.

    Evaluating the same (variant, suite, task, metric, settings) again replaces the value.
    """

    __tablename__ = "evaluations"
    __table_args__ = (UniqueConstraint("identity", name="uq_evaluations_identity"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    # sha256 of (base, variant, suite, task, metric, settings): evaluating again replaces the value.
    identity: Mapped[str] = mapped_column(String(64))
    base_model_id: Mapped[int] = mapped_column(ForeignKey("base_models.id", ondelete="CASCADE"), index=True)
    variant_id: Mapped[int | None] = mapped_column(ForeignKey("variants.id", ondelete="CASCADE"), index=True)
    suite: Mapped[str] = mapped_column(String(128))
    task: Mapped[str] = mapped_column(String(256))
    metric: Mapped[str] = mapped_column(String(128))
    value: Mapped[float] = mapped_column(Float)
    settings: Mapped[dict] = mapped_column(JSON)
    versions: Mapped[dict] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utc_now)


class ServingBenchmarkRow(Base):
    """One load-test run against a served variant; ``metrics`` uses ``vllm bench serve`` key names."""

    __tablename__ = "serving_benchmarks"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    base_model_id: Mapped[int] = mapped_column(ForeignKey("base_models.id", ondelete="CASCADE"), index=True)
    variant_id: Mapped[int | None] = mapped_column(ForeignKey("variants.id", ondelete="CASCADE"), index=True)
    settings: Mapped[dict] = mapped_column(JSON)
    metrics: Mapped[dict] = mapped_column(JSON)
    hardware: Mapped[str] = mapped_column(String(512))
    versions: Mapped[dict] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utc_now)


class StudyCellRow(Base):
    """One cell of a study grid in the work queue that ``depthprune study --worker`` processes share.

    ``study_key`` names the study (a hash of its arguments, so workers started with the same arguments share
    one queue); ``state`` is ``pending``, ``running`` (held by ``worker`` until ``lease_expires_at``, renewed
    by its heartbeat), ``done`` or ``failed``. See :mod:`registry.work_queue`.
    """

    __tablename__ = "study_cells"
    __table_args__ = (
        UniqueConstraint("study_key", "cell_key", name="uq_study_cells_study_cell"),
        CheckConstraint("state IN ('pending', 'running', 'done', 'failed')", name="ck_study_cells_state"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    study_key: Mapped[str] = mapped_column(String(64))
    cell_key: Mapped[str] = mapped_column(Text)
    state: Mapped[str] = mapped_column(String(16))
    worker: Mapped[str | None] = mapped_column(String(256))
    # Claims since the cell was (re)queued: a cell whose workers keep dying is failed after a few.
    attempts: Mapped[int] = mapped_column(Integer)
    lease_expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # The variant the cell produced; NULL for the dense model's evaluation, or once the variant is removed.
    variant_id: Mapped[int | None] = mapped_column(ForeignKey("variants.id", ondelete="SET NULL"), index=True)
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utc_now)
    claimed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class ExperimentRow(Base):
    """The current spec of an A/B experiment that every gateway on this registry routes by.

    ``version`` grows by one with every change (the gateways' ``ETag``); a deleted experiment keeps its row
    with ``spec`` NULL, so that its versions never repeat if it is created again. See
    :mod:`registry.experiments`.
    """

    __tablename__ = "experiments"
    __table_args__ = (UniqueConstraint("name", name="uq_experiments_name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(256))
    # The gateway's ExperimentSpec as JSON (arms, sticky, fallback, forcible); NULL once deleted.
    spec: Mapped[dict | None] = mapped_column(JSON(none_as_null=True))
    version: Mapped[int] = mapped_column(Integer)
    updated_by: Mapped[str] = mapped_column(String(256))
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utc_now)


class ExperimentChangeRow(Base):
    """One change of an experiment: who made it, when, and its spec before and after (the audit trail)."""

    __tablename__ = "experiment_changes"
    __table_args__ = (
        UniqueConstraint("experiment", "version", name="uq_experiment_changes_version"),
        CheckConstraint("action IN ('seed', 'set', 'delete')", name="ck_experiment_changes_action"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    experiment: Mapped[str] = mapped_column(String(256))
    version: Mapped[int] = mapped_column(Integer)
    action: Mapped[str] = mapped_column(String(16))
    actor: Mapped[str] = mapped_column(String(256))
    old_spec: Mapped[dict | None] = mapped_column(JSON(none_as_null=True))
    new_spec: Mapped[dict | None] = mapped_column(JSON(none_as_null=True))
    changed_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utc_now)
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    """Why (a guardrail's figures); None for most operator changes."""
