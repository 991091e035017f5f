"""The registry's Python API: the one shared state of pruning, evaluation, serving and load tests.

Typical use::

    from registry import open_registry
    from registry.records import VariantRecord

    registry = open_registry()               # DEPTHPRUNE_REGISTRY_URL, or SQLite under DEPTHPRUNE_HOME
    registry.register_base_model("meta-llama/Meta-Llama-3-8B", revision=None, weights_sha256=sha,
                                 num_blocks=32, architecture="llama", path="/models/llama3-8b")
    variant = registry.register_variant(VariantRecord(base_model="meta-llama/Meta-Llama-3-8B",
                                        removed_blocks=[...], calibration=asdict(calibration_config),
                                        search="greedy", ...))
    registry.set_alias("ppl-best", variant.name)
    registry.resolve("ppl-best")             # also: a name, an id, "dense", "ppl-best@<base model>"

Variants, evaluations and serving benchmarks of the dense model are attached to the base model;
``resolve("dense")`` returns it as a :class:`VariantInfo` with ``is_dense=True``. Registering a local
checkpoint or base model directory stores the manifest of the files that define the model
(:mod:`registry.integrity`); :meth:`Registry.verify_checkpoint` checks it before serving. A healed variant is
registered like any other, from a record that names its ``parent`` and carries its ``healing``; it is then
resolved, aliased, evaluated and served as any variant, and ``VariantInfo.parent`` keeps the lineage.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from ground.core.errors import UserError
from ground.core.objectives import objective_label
from ground.core.settings import default_registry_url
from registry.database import WRITE_OPTION, create_registry_engine, display_url, retrying
from registry.infos import (
    MEASUREMENT_TABLES,
    STORED_AS_GIVEN,
    aliases_by_variant,
    base_info,
    dense_info,
    measurement_info,
    variant_info,
)
from registry.integrity import check_model_files, hash_model_files
from registry.naming import (
    DENSE,
    auto_variant_name,
    check_name,
    identity_hash,
    json_dict,
    kept_to_original,
    model_slug,
    normalise_model,
    optional_float,
    parse_removed_blocks,
    required_text,
    split_qualified,
)
from registry.records import (
    BaseModelInfo,
    EvaluationInfo,
    ServingBenchmarkInfo,
    VariantInfo,
    VariantRecord,
)
from registry.schema import migrate
from registry.tables import AliasRow, BaseModelRow, EvaluationRow, ServingBenchmarkRow, VariantRow, utc_now
from registry.versions import tool_versions

VariantReference = str | int | VariantInfo
"""What names a variant: its id, name, an alias, ``dense``, ``NAME@BASE``, or a :class:`VariantInfo`."""


def open_registry(url: str | None = None) -> Registry:
    """Connect to the registry, creating or upgrading its schema.

    Args:
        url: SQLAlchemy URL; default :func:`ground.core.settings.default_registry_url` (the
            ``DEPTHPRUNE_REGISTRY_URL`` environment variable, else a SQLite file under ``DEPTHPRUNE_HOME``).

    Returns:
        The open :class:`Registry`.

    Raises:
        UserError: when the URL is not a database URL or does not connect.
    """
    url = url or default_registry_url()
    engine = create_registry_engine(url)
    try:
        migrate(engine)
    except Exception:
        engine.dispose()
        raise
    return Registry(engine, url)


MAX_NAME_LENGTH = 128
"""Longest variant name :func:`registry.naming.check_name` accepts."""


def registered_files(directory: str | None) -> dict[str, str] | None:
    """The manifest to store for a checkpoint or base model directory; None when it is not a local one, or
    holds no weights (then nothing can be served from it, and verifying it says so)."""
    if directory is None or not Path(directory).is_dir():
        return None
    try:
        return hash_model_files(directory).files
    except FileNotFoundError:
        return None


def healed_variant_name(parent_name: str, method: str, identity: str) -> str:
    """A readable, unique default name for a healed variant: ``<parent name>-lora-1a2b3c``."""
    method_part = re.sub(r"[^a-z0-9]+", "-", method.lower()).strip("-") or "healed"
    suffix = f"-{method_part}-{identity[:6]}"
    return parent_name[: MAX_NAME_LENGTH - len(suffix)] + suffix


class Registry:
    """An open registry database. Use :func:`open_registry` to get one; close it when done."""

    def __init__(self, engine: Engine, url: str):
        self.engine = engine
        """The SQLAlchemy engine."""
        self.url = url
        """The URL it was opened with."""
        self._write_engine = engine.execution_options(**{WRITE_OPTION: True})

    def __repr__(self) -> str:
        return f"Registry({display_url(self.url)!r})"

    def __enter__(self) -> Registry:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        """Release the database connections."""
        self.engine.dispose()

    @contextmanager
    def _reading(self) -> Iterator[Session]:
        with Session(self.engine) as session:
            yield session

    def _write(self, operation):
        """Run ``operation(session)`` in one write transaction, retried on transient failures."""

        def attempt():
            with Session(self._write_engine) as session, session.begin():
                return operation(session)

        return retrying(attempt)

    # ---------------------------------------------------------------- base models

    def register_base_model(
        self,
        model: str,
        *,
        revision: str | None,
        weights_sha256: str,
        num_blocks: int,
        architecture: str,
        path: str | None = None,
    ) -> BaseModelInfo:
        """Record a dense model; registering it again updates its row.

        A local directory is hashed file by file (:func:`registry.integrity.hash_model_files`): the manifest
        of its weights, config, tokenizer and generation config is what ``dense`` is checked against before
        it is served.

        Args:
            model: hub id or local directory (a directory is stored as its absolute path).
            revision: hub revision, if any.
            weights_sha256: :func:`ground.core.checksums.weights_sha256` of its weights.
            num_blocks: number of decoder blocks N.
            architecture: ``config.model_type``.
            path: local directory of the weights (defaults to ``model`` when that is a directory).

        Returns:
            The stored :class:`BaseModelInfo`.
        """
        key = normalise_model(model)
        weights_sha256 = required_text(weights_sha256, "weights_sha256")
        architecture = required_text(architecture, "architecture")
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 2:
            raise UserError(f"num_blocks must be an integer >= 2, got {num_blocks!r}")
        if path is not None:
            path = str(Path(path).expanduser().resolve())
        elif Path(key).is_dir():
            path = key
        model_files = registered_files(path)  # outside the write transaction: hashing takes a while

        def operation(session: Session) -> BaseModelInfo:
            row = session.scalar(select(BaseModelRow).where(BaseModelRow.model == key))
            if row is None:
                row = BaseModelRow(model=key, created_at=utc_now())
                session.add(row)
            row.revision, row.weights_sha256, row.num_blocks = revision, weights_sha256, num_blocks
            row.architecture, row.updated_at = architecture, utc_now()
            row.path = path or row.path
            if model_files is not None:
                row.model_files = model_files
            session.flush()
            return base_info(row)

        return self._write(operation)

    def base_models(self) -> list[BaseModelInfo]:
        """Every registered base model, by name."""
        with self._reading() as session:
            return [
                base_info(row) for row in session.scalars(select(BaseModelRow).order_by(BaseModelRow.model))
            ]

    def get_base_model(self, model: str) -> BaseModelInfo:
        """The base model registered as ``model`` (hub id, path, or short name); UserError if unknown."""
        with self._reading() as session:
            return base_info(self._find_base(session, model))

    # ---------------------------------------------------------------- variants

    def register_variant(self, record: VariantRecord) -> VariantInfo:
        """Store a pruned variant. The same (base, removed set, calibration, search) updates its row.

        On an update, every field takes the record's value, except that ``checkpoint_path`` and
        ``checkpoint_sha256`` given as ``None`` keep the recorded checkpoint, and ``name=None`` keeps
        the recorded name. A healed variant (a record with ``parent`` and ``healing``) is its own row,
        told apart from its parent by the parent and the healing settings (not the measurements).
        A checkpoint directory is hashed file by file (``VariantInfo.checkpoint_files``).

        Args:
            record: the variant (see :class:`VariantRecord` for its fields); its ``base_model`` must be
                registered, and its removed blocks must leave at least one of the base model's blocks.
                A ``parent`` must be a registered variant of the same base model with the same removed
                blocks.

        Returns:
            The stored :class:`VariantInfo`.

        Raises:
            UserError: an unregistered base model, removed blocks out of its range, a name taken by
                another variant, or a parent that is unknown, dense, or has other blocks.
        """
        if not isinstance(record, VariantRecord):
            raise TypeError(f"register_variant takes a VariantRecord, got {type(record).__name__}")
        versions = tool_versions()
        # Hashed outside the write transaction. A checkpoint given without its checksum stays unverifiable,
        # as before manifests: the caller did not vouch for what is on disk.
        files = registered_files(record.checkpoint_path) if record.checkpoint_sha256 else None
        return self._write(lambda session: self._store_variant(session, record, versions, files))

    def _store_variant(
        self, session: Session, record: VariantRecord, versions: dict, files: dict | None
    ) -> VariantInfo:
        """Insert or update the row of ``record`` (inside a write transaction)."""
        base = self._find_base(session, record.base_model)
        removed = parse_removed_blocks(record.removed_blocks, base.num_blocks)
        parent = None if record.parent is None else self._find_parent(session, base, removed, record)
        if parent is None:
            identity = identity_hash(base.model, removed, record.calibration, record.search)
        else:  # the parent's own identity would be the one above: the healing settings tell them apart
            lineage = {"parent": parent.identity, "healing": record.healing_settings()}
            identity = identity_hash(base.model, removed, record.calibration, record.search, lineage)
        row = session.scalar(select(VariantRow).where(VariantRow.identity == identity))
        if record.name is not None:
            self._check_name_free(session, record.name, row.id if row is not None else None)
        if row is None:
            if record.name is not None:
                name = record.name
            elif parent is not None:
                name = healed_variant_name(parent.name, record.healing["method"], identity)
            else:
                name = auto_variant_name(
                    base.model, objective_label(record.calibration), record.search, removed, identity
                )
            row = VariantRow(identity=identity, base_model_id=base.id, created_at=utc_now(), name=name)
            session.add(row)
        elif record.name is not None:
            row.name = record.name
        row.base_weights_sha256 = base.weights_sha256
        row.removed_blocks, row.kept_to_original = removed, kept_to_original(removed, base.num_blocks)
        row.objective = record.objective
        row.parent_id = None if parent is None else parent.id
        for what in STORED_AS_GIVEN:
            setattr(row, what, getattr(record, what))
        row.fit = None if record.quality is None else record.quality.get("fit")
        if record.checkpoint_path is not None or record.checkpoint_sha256 is not None:
            row.checkpoint_path, row.checkpoint_sha256 = record.checkpoint_path, record.checkpoint_sha256
            row.checkpoint_files = files
        row.versions, row.updated_at = versions, utc_now()
        session.flush()
        return variant_info(session, base, row)

    def _find_parent(
        self, session: Session, base: BaseModelRow, removed: list[int], record: VariantRecord
    ) -> VariantRow:
        """The row of ``record.parent``: a variant of the same base model with the same removed blocks."""
        parent_base, parent = self._find(session, record.parent)
        if parent is None:
            raise UserError(
                f"the parent of a healed variant is a pruned variant, not the dense model ({record.parent!r})"
            )
        if parent_base.id != base.id or list(parent.removed_blocks) != removed:
            raise UserError(
                f"a healed variant keeps its parent's blocks: {record.parent!r} is {parent_base.model} "
                f"without {list(parent.removed_blocks)}, the record {base.model} without {removed}"
            )
        return parent

    def resolve(self, name: VariantReference) -> VariantInfo:
        """The variant named by an id, a name, an alias, ``dense``, or ``NAME@BASE``.

        ``dense`` (and an alias) is ambiguous when several base models have one; then qualify it with the
        base model, ``dense@meta-llama/Meta-Llama-3-8B`` or ``dense@meta-llama-3-8b`` (the short name).
        A base model's own hub id or path also resolves to its dense model.

        Raises:
            UserError: when nothing, or more than one thing, has that name.
        """
        with self._reading() as session:
            base, row = self._find(session, name)
            return dense_info(session, base) if row is None else variant_info(session, base, row)

    def list_variants(
        self, base_model: str | None = None, *, include_dense: bool = False
    ) -> list[VariantInfo]:
        """Registered variants, by base model then registration order.

        Args:
            base_model: only this base model's variants.
            include_dense: put each base model's dense model first.
        """
        with self._reading() as session:
            bases = (
                [self._find_base(session, base_model)]
                if base_model is not None
                else list(session.scalars(select(BaseModelRow).order_by(BaseModelRow.model)))
            )
            found: list[VariantInfo] = []
            for base in bases:
                aliases = aliases_by_variant(session, base)
                if include_dense:
                    found.append(dense_info(session, base, aliases.get(None, [])))
                rows = session.scalars(
                    select(VariantRow).where(VariantRow.base_model_id == base.id).order_by(VariantRow.id)
                )
                found.extend(variant_info(session, base, row, aliases.get(row.id, [])) for row in rows)
            return found

    def healed_from(self, variant: VariantReference) -> list[VariantInfo]:
        """The variants healed from ``variant`` (its children in the lineage), by registration order."""
        with self._reading() as session:
            base, row = self._find(session, variant)
            if row is None:
                return []
            children = session.scalars(
                select(VariantRow).where(VariantRow.parent_id == row.id).order_by(VariantRow.id)
            )
            return [variant_info(session, base, child) for child in children]

    def set_alias(self, alias: str, variant: VariantReference) -> VariantInfo:
        """Point ``alias`` (per base model) at a variant, or at ``dense``; moves an existing alias.

        Returns:
            The variant the alias now points at.
        """
        check_name(alias, "alias")

        def operation(session: Session) -> VariantInfo:
            base, row = self._find(session, variant)
            clash = session.scalar(select(VariantRow).where(VariantRow.name == alias))
            if clash is not None:
                raise UserError(
                    f"alias {alias!r} is already the name of variant {clash.id}; choose another alias"
                )
            existing = session.scalar(
                select(AliasRow).where(AliasRow.base_model_id == base.id, AliasRow.alias == alias)
            )
            if existing is None:
                existing = AliasRow(base_model_id=base.id, alias=alias)
                session.add(existing)
            existing.variant_id = None if row is None else row.id
            existing.updated_at = utc_now()
            session.flush()
            return dense_info(session, base) if row is None else variant_info(session, base, row)

        return self._write(operation)

    def remove_alias(self, alias: str, base_model: str | None = None) -> None:
        """Delete an alias (``ALIAS@BASE`` or ``base_model`` picks one when several base models have it)."""

        def operation(session: Session) -> None:
            name, qualifier = split_qualified(alias)
            rows = self._alias_rows(session, name, qualifier or base_model)
            if not rows:
                raise UserError(f"no alias {alias!r}; see `depthprune variants list`")
            if len(rows) > 1:
                raise UserError(self._ambiguous_alias_message(session, name, rows))
            session.delete(rows[0])

        self._write(operation)

    def aliases(self) -> dict[str, str]:
        """``{ALIAS@BASE: variant name}`` for every alias (``dense`` for the base model itself)."""
        with self._reading() as session:
            found = {}
            for alias in session.scalars(select(AliasRow).order_by(AliasRow.alias)):
                base = session.get(BaseModelRow, alias.base_model_id)
                target = DENSE if alias.variant_id is None else session.get(VariantRow, alias.variant_id).name
                found[f"{alias.alias}@{base.model}"] = target
            return found

    def remove_variant(
        self, name: VariantReference, *, delete_checkpoint: bool = False, force: bool = False
    ) -> VariantInfo:
        """Delete a variant with its aliases, evaluations and serving benchmarks; variants healed from it
        stay, without a parent.

        Args:
            name: the variant's id or name (not an alias, so that an alias never deletes by surprise).
            delete_checkpoint: also delete its checkpoint directory (only one holding ``pruning.json``).
            force: delete the checkpoint even while a running gateway serves the variant.

        Returns:
            What was removed.

        Raises:
            UserError: an unknown name, an alias, the dense model, or (without ``force``) a checkpoint to
                delete that a gateway serves (:meth:`refuse_if_served`).
        """
        if delete_checkpoint and not force:
            self.refuse_if_served(name)

        def operation(session: Session) -> VariantInfo:
            base, row = self._find(session, name)
            if row is None:
                raise UserError(
                    f"{name!r} is the dense base model {base.model}; only pruned variants can be removed"
                )
            if isinstance(name, str) and name not in (row.name, str(row.id)):
                raise UserError(
                    f"{name!r} is an alias of {row.name!r}: remove the variant by its name, or the alias "
                    f"with `depthprune variants alias {name} --delete`"
                )
            info = variant_info(session, base, row)
            # A healed variant outlives its parent (its weights stand on their own); only the link goes.
            for child in session.scalars(select(VariantRow).where(VariantRow.parent_id == row.id)):
                child.parent_id = None
            session.flush()
            session.delete(row)
            return info

        removed = self._write(operation)
        if delete_checkpoint and removed.checkpoint_path:
            checkpoint = Path(removed.checkpoint_path)
            # Only a directory this project wrote; never a base model or an unrelated folder.
            if (checkpoint / "pruning.json").is_file():
                shutil.rmtree(checkpoint)
        return removed

    def refuse_if_served(self, name: VariantReference) -> None:
        """Refuse to take away the checkpoint of a variant that a running gateway serves.

        The gateways are those of this ``DEPTHPRUNE_HOME`` (:mod:`registry.serving`): a managed backend's
        checkpoint is on the gateway's own disk.

        Raises:
            UserError: one line naming the gateways (URL and pid) and the way out (stop them, or ``--force``).
        """
        from registry.serving import serving_gateways

        info = self.resolve(name)
        if info.is_dense or not info.checkpoint_path:
            return
        gateways = serving_gateways(info.checkpoint_path)
        if gateways:
            where = ", ".join(f"{gateway['url']} (pid {gateway['pid']})" for gateway in gateways)
            raise UserError(
                f"variant {info.name!r} is served by the gateway at {where}: deleting its checkpoint would "
                f"take it down; stop that gateway first, or pass --force (the gateway then keeps "
                f"{info.name!r} down at its next restart)"
            )

    # ---------------------------------------------------------------- evaluations and benchmarks

    def add_evaluation(
        self, variant: VariantReference, *, suite: str, task: str, metric: str, value: float, settings: dict
    ) -> EvaluationInfo:
        """Record one metric of a variant; the same (variant, suite, task, metric, settings) is replaced.

        Args:
            variant: which variant (id, name, alias, ``dense``, or a :class:`VariantInfo`).
            suite: the harness, e.g. ``ppl`` or ``lm-eval``.
            task: the task or data set, e.g. ``wikitext2`` or ``piqa``.
            metric: e.g. ``perplexity``, ``acc``, ``acc_norm``.
            value: the measurement (infinity allowed, NaN not).
            settings: how it was measured; its ``statistics`` entry (n, 95 % intervals, per-item scores,
                the comparison with a baseline: :mod:`pruning.evaluation.item_scores`) is stored but is not
                part of the measurement's identity.

        Returns:
            The stored :class:`EvaluationInfo`.
        """
        suite, task, metric = (
            required_text(value_, what)
            for value_, what in ((suite, "suite"), (task, "task"), (metric, "metric"))
        )
        number = optional_float(value, "value")
        if number is None:
            raise UserError(f"evaluation value of {suite}/{task}/{metric} is missing or NaN")
        settings = json_dict(settings, "settings")
        versions = tool_versions()

        def store(session: Session, base: BaseModelRow, variant_id: int | None) -> EvaluationRow:
            # What was measured (``statistics``: intervals, per-item scores, the pairing) is not part of how
            # it was measured: a rerun of the same measurement replaces the row.
            how = {key: value for key, value in settings.items() if key != "statistics"}
            identity = identity_hash(base.model, variant_id, suite, task, metric, how)
            evaluation = session.scalar(select(EvaluationRow).where(EvaluationRow.identity == identity))
            if evaluation is None:
                evaluation = EvaluationRow(
                    identity=identity,
                    base_model_id=base.id,
                    variant_id=variant_id,
                    suite=suite,
                    task=task,
                    metric=metric,
                    settings=settings,
                )
                session.add(evaluation)
            evaluation.value, evaluation.versions, evaluation.created_at = number, versions, utc_now()
            evaluation.settings = settings  # the latest statistics
            return evaluation

        return self._add_measurement(variant, EvaluationInfo, store)

    def evaluations(self, variant: VariantReference) -> list[EvaluationInfo]:
        """A variant's evaluations, by suite, task and metric."""
        table = EvaluationRow
        return self._measurements(variant, EvaluationInfo, (table.suite, table.task, table.metric, table.id))

    def add_serving_benchmark(
        self, variant: VariantReference, *, settings: dict, metrics: dict, hardware: str
    ) -> ServingBenchmarkInfo:
        """Record one load-test run of a served variant (runs accumulate; none is replaced).

        Args:
            variant: which variant (id, name, alias, ``dense``, or a :class:`VariantInfo`).
            settings: load settings (request rate, concurrency, lengths, number of prompts, ...).
            metrics: results under ``vllm bench serve`` key names; per-request lists are dropped, only
                scalar values are kept.
            hardware: where it ran.

        Returns:
            The stored :class:`ServingBenchmarkInfo`.
        """
        settings = json_dict(settings, "settings")
        metrics = {
            key: value
            for key, value in json_dict(metrics, "metrics").items()
            if not isinstance(value, (list, dict))
        }
        if not metrics:
            raise UserError("serving benchmark metrics are empty")
        hardware = required_text(hardware, "hardware")
        versions = tool_versions()

        def store(session: Session, base: BaseModelRow, variant_id: int | None) -> ServingBenchmarkRow:
            benchmark = ServingBenchmarkRow(
                base_model_id=base.id,
                variant_id=variant_id,
                settings=settings,
                metrics=metrics,
                hardware=hardware,
                versions=versions,
                created_at=utc_now(),
            )
            session.add(benchmark)
            return benchmark

        return self._add_measurement(variant, ServingBenchmarkInfo, store)

    def serving_benchmarks(self, variant: VariantReference) -> list[ServingBenchmarkInfo]:
        """A variant's load-test runs, newest first."""
        table = ServingBenchmarkRow
        return self._measurements(variant, ServingBenchmarkInfo, (table.created_at.desc(), table.id.desc()))

    def _measurements(self, variant: VariantReference, info: type, order: tuple) -> list:
        """The rows of ``info``'s table (evaluations or serving benchmarks) of one variant, in ``order``."""
        table = MEASUREMENT_TABLES[info]
        with self._reading() as session:
            base, row = self._find(session, variant)
            query = select(table).where(table.base_model_id == base.id)
            query = query.where(table.variant_id.is_(None) if row is None else table.variant_id == row.id)
            return [
                measurement_info(info, base, row, found) for found in session.scalars(query.order_by(*order))
            ]

    def _add_measurement(self, variant: VariantReference, info: type, store):
        """Write one measurement of ``variant``: ``store(session, base, variant_id)`` returns its row (found
        and updated, or new and added); returns it as ``info``."""

        def operation(session: Session):
            base, row = self._find(session, variant)
            stored = store(session, base, None if row is None else row.id)
            session.flush()
            return measurement_info(info, base, row, stored)

        return self._write(operation)

    # ---------------------------------------------------------------- checkpoints

    def verify_checkpoint(self, variant: VariantReference) -> None:
        """Refuse a checkpoint whose files changed since it was registered.

        Every file of the registered manifest (weights, config, tokenizer, generation config, chat
        template) must be there with the same sha256, and no weights file may have been added; a row
        registered before manifests is checked by its weights checksum. For the dense model, a local
        directory is checked against the base model's; a hub id is left to the hub's own revision pinning.

        Raises:
            UserError: when the directory is missing, has no recorded checksum, or no longer matches (the
                message names each file that changed, went missing or was added).
        """
        info = variant if isinstance(variant, VariantInfo) else self.resolve(variant)
        label = info.qualified_name
        if info.is_dense:
            if not info.checkpoint_path or not Path(info.checkpoint_path).is_dir():
                return
        elif not info.checkpoint_path:
            raise UserError(f"variant {label!r} has no checkpoint; write one with `depthprune checkpoint`")
        check_model_files(
            info.checkpoint_path,
            label,
            files=info.checkpoint_files,
            weights_checksum=info.checkpoint_sha256,
        )

    # ---------------------------------------------------------------- lookups (inside a session)

    def _find_base(self, session: Session, model: str) -> BaseModelRow:
        if not isinstance(model, str) or not model:
            raise UserError(f"base model must be a hub id, path or short name, got {model!r}")
        row = session.scalar(select(BaseModelRow).where(BaseModelRow.model == normalise_model(model)))
        if row is not None:
            return row
        matches = [base for base in session.scalars(select(BaseModelRow)) if model_slug(base.model) == model]
        if len(matches) == 1:
            return matches[0]
        if matches:
            raise UserError(
                f"base model {model!r} is ambiguous: " + ", ".join(base.model for base in matches)
            )
        known = (
            ", ".join(session.scalars(select(BaseModelRow.model).order_by(BaseModelRow.model))) or "none yet"
        )
        raise UserError(
            f"base model {model!r} is not registered (registered: {known}); `depthprune prune` registers it"
        )

    def _alias_rows(self, session: Session, alias: str, base_model: str | None) -> list[AliasRow]:
        query = select(AliasRow).where(AliasRow.alias == alias)
        if base_model is not None:
            query = query.where(AliasRow.base_model_id == self._find_base(session, base_model).id)
        return list(session.scalars(query))

    def _ambiguous_alias_message(self, session: Session, name: str, rows: list[AliasRow]) -> str:
        options = ", ".join(f"{name}@{session.get(BaseModelRow, row.base_model_id).model}" for row in rows)
        return f"{name!r} is ambiguous, several base models have it: say which, e.g. {options}"

    def _find(self, session: Session, reference: VariantReference) -> tuple[BaseModelRow, VariantRow | None]:
        """``(base, variant row)``; the row is ``None`` for the dense model."""
        if isinstance(reference, VariantInfo):
            if reference.is_dense:
                return self._find_base(session, reference.base_model), None
            reference = reference.id
        if isinstance(reference, int) and not isinstance(reference, bool):
            row = session.get(VariantRow, reference)
            if row is None:
                raise UserError(f"no variant with id {reference}; see `depthprune variants list`")
            return row.base, row
        if not isinstance(reference, str) or not reference.strip():
            raise UserError(f"a variant is named by its id, name, an alias or 'dense', got {reference!r}")
        reference = reference.strip()
        if reference.isdigit():
            return self._find(session, int(reference))
        row = session.scalar(select(VariantRow).where(VariantRow.name == reference))
        if row is not None:
            return row.base, row
        name, qualifier = split_qualified(reference)
        if name == DENSE:
            if qualifier is not None:
                return self._find_base(session, qualifier), None
            bases = list(session.scalars(select(BaseModelRow).order_by(BaseModelRow.model)))
            if len(bases) == 1:
                return bases[0], None
            if not bases:
                raise UserError("no base model is registered yet, so there is no 'dense' model to use")
            raise UserError(
                "'dense' is ambiguous, several base models are registered: say which, e.g. "
                + ", ".join(f"dense@{base.model}" for base in bases)
            )
        aliases = self._alias_rows(session, name, qualifier)
        if len(aliases) == 1:
            base = session.get(BaseModelRow, aliases[0].base_model_id)
            return base, None if aliases[0].variant_id is None else session.get(
                VariantRow, aliases[0].variant_id
            )
        if aliases:
            raise UserError(self._ambiguous_alias_message(session, name, aliases))
        if qualifier is not None:  # NAME@BASE with a variant's own name: accepted when the base matches
            row = session.scalar(select(VariantRow).where(VariantRow.name == name))
            if row is not None and row.base_model_id == self._find_base(session, qualifier).id:
                return row.base, row
        base = session.scalar(select(BaseModelRow).where(BaseModelRow.model == normalise_model(reference)))
        if base is not None:
            return base, None
        raise UserError(f"no variant or alias named {reference!r}; see `depthprune variants list`")

    @staticmethod
    def _check_name_free(session: Session, name: str, own_id: int | None) -> None:
        holder = session.scalar(select(VariantRow).where(VariantRow.name == name))
        if holder is not None and holder.id != own_id:
            raise UserError(
                f"variant name {name!r} is taken by another variant (id {holder.id}); choose another"
            )
        if session.scalar(select(AliasRow).where(AliasRow.alias == name)) is not None:
            raise UserError(f"variant name {name!r} is already an alias; choose another name")
