"""The registry's rows as the records callers get (:mod:`registry.records`): base models, variants (the
dense model as one), evaluations and serving benchmarks.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from registry.naming import DENSE
from registry.records import (
    MEASUREMENT_FIELDS,
    BaseModelInfo,
    EvaluationInfo,
    ServingBenchmarkInfo,
    VariantInfo,
)
from registry.tables import AliasRow, BaseModelRow, EvaluationRow, ServingBenchmarkRow, VariantRow, utc

STORED_AS_GIVEN = ("calibration", "search", "search_options", *MEASUREMENT_FIELDS, "healing", "quality")
"""Fields of a :class:`VariantRecord` that its row stores unchanged (the rest are derived or conditional)."""

MEASUREMENT_TABLES = {EvaluationInfo: EvaluationRow, ServingBenchmarkInfo: ServingBenchmarkRow}
"""The table each kind of measurement of a variant is stored in."""


def copied(value):
    """A stored JSON value as the info carries it: dicts copied (the row's own stays with the session)."""
    return dict(value) if isinstance(value, dict) else value


def measurement_info(info: type, base: BaseModelRow, row: VariantRow | None, stored):
    """An :class:`EvaluationInfo` or :class:`ServingBenchmarkInfo` from its row: the variant it belongs to,
    then every other field from the column of the same name."""
    values = {"variant": DENSE if row is None else row.name, "variant_id": None if row is None else row.id}
    values["base_model"] = base.model
    for item in dataclasses.fields(info):
        if item.name not in values:
            value = getattr(stored, item.name)
            values[item.name] = utc(value) if isinstance(value, datetime) else copied(value)
    return info(**values)


def base_info(row: BaseModelRow) -> BaseModelInfo:
    """A base model's row as its record."""
    return BaseModelInfo(
        id=row.id,
        model=row.model,
        revision=row.revision,
        weights_sha256=row.weights_sha256,
        num_blocks=row.num_blocks,
        architecture=row.architecture,
        path=row.path,
        created_at=utc(row.created_at),
        updated_at=utc(row.updated_at),
        model_files=None if row.model_files is None else dict(row.model_files),
    )


def alias_names(session: Session, base: BaseModelRow, row: VariantRow | None) -> list[str]:
    """The aliases of a variant (``row``) or of the dense model (``None``), sorted."""
    query = select(AliasRow.alias).where(AliasRow.base_model_id == base.id)
    query = query.where(AliasRow.variant_id.is_(None) if row is None else AliasRow.variant_id == row.id)
    return list(session.scalars(query.order_by(AliasRow.alias)))


def aliases_by_variant(session: Session, base: BaseModelRow) -> dict[int | None, list[str]]:
    """``{variant id (None = dense): [aliases]}`` of one base model, in one query."""
    found: dict[int | None, list[str]] = {}
    query = select(AliasRow).where(AliasRow.base_model_id == base.id).order_by(AliasRow.alias)
    for alias in session.scalars(query):
        found.setdefault(alias.variant_id, []).append(alias.alias)
    return found


def variant_info(
    session: Session, base: BaseModelRow, row: VariantRow, aliases: list[str] | None = None
) -> VariantInfo:
    """A variant's row as its record; ``aliases`` when the caller already has them."""
    return VariantInfo(
        id=row.id,
        name=row.name,
        base_model=base.model,
        base_revision=base.revision,
        num_blocks=base.num_blocks,
        architecture=base.architecture,
        removed_blocks=list(row.removed_blocks),
        kept_to_original=list(row.kept_to_original),
        **{what: copied(getattr(row, what)) for what in STORED_AS_GIVEN},
        checkpoint_path=row.checkpoint_path,
        checkpoint_sha256=row.checkpoint_sha256,
        created_at=utc(row.created_at),
        versions=dict(row.versions),
        aliases=alias_names(session, base, row) if aliases is None else aliases,
        is_dense=False,
        base_weights_sha256=row.base_weights_sha256,
        updated_at=utc(row.updated_at),
        parent=None if row.parent_id is None else session.get(VariantRow, row.parent_id).name,
        parent_id=row.parent_id,
        checkpoint_files=None if row.checkpoint_files is None else dict(row.checkpoint_files),
        fit=row.fit,
    )


def dense_info(session: Session, base: BaseModelRow, aliases: list[str] | None = None) -> VariantInfo:
    """The dense model of ``base`` as a variant record (``is_dense``)."""
    return VariantInfo(
        id=None,
        name=DENSE,
        base_model=base.model,
        base_revision=base.revision,
        num_blocks=base.num_blocks,
        architecture=base.architecture,
        removed_blocks=[],
        kept_to_original=list(range(base.num_blocks)),
        calibration={},
        search=DENSE,
        search_options={},
        **dict.fromkeys(MEASUREMENT_FIELDS),
        checkpoint_path=base.path or base.model,
        checkpoint_sha256=base.weights_sha256,
        created_at=utc(base.created_at),
        versions={},
        aliases=alias_names(session, base, None) if aliases is None else aliases,
        is_dense=True,
        base_weights_sha256=base.weights_sha256,
        updated_at=utc(base.updated_at),
        checkpoint_files=None if base.model_files is None else dict(base.model_files),
        quality=None,
        fit=True,
    )
