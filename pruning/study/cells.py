"""The study's cells: pruned, evaluated, and kept in the manifest, each computed once.

:func:`prune_missing` runs the cells neither the study's manifest (``cells.json`` in the report directory) nor
the registry already holds through :func:`pruning.pipeline.prune.prune`, one call (one shared evaluator) per
calibration configuration, budget, seed and prior; :func:`pruning.study.evaluation.evaluate_all` then
judges every variant (and the dense model).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from ground.core.checksums import has_weight_files, released_weights
from ground.core.errors import UserError
from pruning.study.paths import recorded_path
from pruning.study.plan import Cell, StudyPlan, cell_prune_config

MANIFEST = "cells.json"


@dataclass
class CellResult:
    """What a finished cell produced (one manifest entry)."""

    key: str
    objective: str
    data: str
    drop: int
    search: str
    seed: int
    prior: str
    removed_blocks: list[int]
    calibration_loss: float | None
    dense_loss: float | None
    search_seconds: float | None
    block_forwards: int | None
    subset_evaluations: int | None
    variant: str | None
    """Registry name of the variant."""
    checkpoint: str | None
    """Checkpoint directory, relative to the depthprune home when inside it
    (:func:`pruning.study.paths.recorded_path`; read it with :func:`~pruning.study.paths.resolved_path`)."""
    metrics: dict[str, float] = field(default_factory=dict)
    """``"task/metric" -> value`` from the evaluation."""
    timing: str | None = None
    """Search-cost accounting of ``search_seconds`` (None: recorded before it was kept, i.e. ``shared``)."""
    protected: list[int] = field(default_factory=list)
    """Blocks that were protected from removal."""
    data_seed: int | None = None
    """Seed of the calibration draw (None: recorded before it was kept, when every seed drew with 0)."""
    reused_from: str | None = None
    """Key of the cell this result was copied from (a deterministic search under a pinned draw); None: run."""
    truncated_items: int = 0
    """Calibration items cut to fit the sequence length (:func:`truncated_items`)."""
    evaluation: dict | None = None
    """What decided ``metrics`` besides the mask (:func:`pruning.study.evaluation.evaluation_record`: suites,
    dtype, window, limits); None: not recorded (numbers then count only where the registry holds them)."""
    search_device: str | None = None
    """What ran the search (:func:`ground.planning.devices.device_name`): its seconds compare only with
    seconds measured on the same; None: recorded before it was kept."""
    calibration_items: dict | None = None
    """Fingerprints of the calibration draw's documents or questions (``{"unit", "sha256_16"}``,
    :mod:`pruning.calibration.data.fingerprints`); filled by :func:`~pruning.study.calibration_items.
    fill_calibration_items`."""

    def matches(self, cell: Cell) -> bool:
        """Whether this result was produced under ``cell``'s accounting and protection."""
        return (self.timing or "shared") == cell.timing and list(self.protected) == list(cell.protected)


def load_manifest(out: Path) -> dict[str, CellResult]:
    """Finished cells recorded in ``out/cells.json`` (empty when there is none)."""
    path = Path(out) / MANIFEST
    if not path.is_file():
        return {}
    try:
        rows = json.loads(path.read_text())
    except json.JSONDecodeError:
        raise UserError(
            f"{path} is not valid JSON; remove it to rebuild the study from the registry"
        ) from None
    return {row["key"]: CellResult(**row) for row in rows.get("cells", [])}


def save_manifest(out: Path, plan: StudyPlan, cells: dict[str, CellResult], dense: dict[str, float]) -> None:
    """Write the manifest atomically (a crash never leaves a truncated file)."""
    out.mkdir(parents=True, exist_ok=True)
    config = dataclasses.asdict(plan.config)
    config["out"], config["checkpoints"] = (
        str(plan.config.out),
        recorded_path(plan.config.checkpoints),
    )
    payload = {
        "model": recorded_path(plan.model),
        "num_blocks": plan.num_blocks,
        "config": config,
        "dense": dense,
        "cells": [dataclasses.asdict(cells[cell.key]) for cell in plan.cells if cell.key in cells],
    }
    temporary = out / f".{MANIFEST}.tmp"
    temporary.write_text(json.dumps(payload, indent=1, default=str))
    temporary.replace(out / MANIFEST)


def truncated_items(variant) -> int:
    """How many calibration items were cut to fit ``seq_len``: the ``truncated_items`` of the variant's
    calibration record, where :func:`pruning.pipeline.prune.variant_record` puts it under ``--truncate``; 0
    when the record holds none (no ``--truncate``, or a record from before the count was kept).

    Args:
        variant: a registry :class:`~registry.VariantInfo` or a
            :class:`~pruning.pipeline.prune.VariantOutcome` of ``prune``: both carry the calibration record as
            registered.
    """
    return int((variant.calibration or {}).get("truncated_items") or 0)


def fill_reused(plan: StudyPlan, done: dict[str, CellResult]) -> None:
    """Give each reused cell (:attr:`~pruning.study.plan.Cell.reused_from`) a copy of its source's result,
    under its own key and seed, once the source is done."""
    for cell in plan.cells:
        source = done.get(cell.reused_from) if cell.reused_from else None
        if source is not None:
            done[cell.key] = dataclasses.replace(
                source, key=cell.key, seed=cell.seed, reused_from=cell.reused_from
            )


def _prior_of(options: dict) -> str:
    return "random" if options.get("prior") == "random" else "single_block"


def find_in_registry(registry, model: str, cell: Cell, options: dict | None = None) -> CellResult | None:
    """A registered variant produced by exactly this cell (calibration, M, search, seed, prior), if any;
    with ``options`` (the search's settings the study asks for, :func:`~pruning.study.plan.cell_options`)
    only one whose recorded settings agree (a CBO of another ``keep`` is another cell's)."""
    wanted = cell.calibration.as_record()
    try:
        variants = registry.list_variants(model)
    except UserError:  # base model not registered yet: nothing was pruned
        return None
    asked = options
    for variant in reversed(variants):  # newest first
        options = variant.search_options or {}
        if (
            variant.search == cell.search
            and variant.calibration == wanted
            and len(variant.removed_blocks) == cell.drop
            and cell.seed in options.get("seeds", [options.get("seed")])
            and _prior_of(options) == cell.prior
            and (options.get("timing") or "shared") == cell.timing
            and options.get("protected", []) == list(cell.protected)
            and all(options.get(name) == value for name, value in (asked or {}).items())
            and variant.checkpoint_path
            # not a copy that left its weights elsewhere; weights released once evaluated are no loss
            and (
                has_weight_files(variant.checkpoint_path)
                or released_weights(variant.checkpoint_path) is not None
            )
        ):
            return result_of_variant(cell, variant)
    return None


def result_of_variant(cell: Cell, variant) -> CellResult:
    """The result of ``cell`` as the registry recorded it (``variant``: a :class:`registry.VariantInfo`)."""
    return _cell_result(
        cell,
        variant.removed_blocks,
        variant.calibration_loss,
        variant.dense_loss,
        variant.search_seconds,
        variant.block_forwards,
        variant.subset_evaluations,
        variant.name,
        variant.checkpoint_path,
        truncated_items(variant),
        variant.search_options,
    )


def _cell_result(
    cell: Cell,
    removed,
    loss,
    dense_loss,
    seconds,
    forwards,
    subsets,
    name,
    checkpoint,
    truncated: int,
    options: dict | None = None,
) -> CellResult:
    return CellResult(
        key=cell.key,
        objective=cell.calibration.objective,
        data=cell.calibration.data,
        drop=cell.drop,
        search=cell.search,
        seed=cell.seed,
        prior=cell.prior,
        removed_blocks=sorted(int(i) for i in removed),
        calibration_loss=loss,
        dense_loss=dense_loss,
        search_seconds=seconds,
        block_forwards=forwards,
        subset_evaluations=subsets,
        variant=name,
        checkpoint=recorded_path(checkpoint),
        timing=cell.timing,
        protected=list(cell.protected),
        data_seed=cell.data_seed,
        truncated_items=truncated,
        search_device=((options or {}).get("cost") or {}).get("device"),
    )


# ------------------------------------------------------------------------------------------------ running


def _group_missing(missing: list[Cell]) -> list[tuple[Cell, list[Cell]]]:
    """Missing cells grouped by (calibration, M, seed, prior): one prune run each, in grid order."""
    groups: dict[str, tuple[Cell, list[Cell]]] = {}
    for cell in missing:
        group = cell.key.rsplit("|", 3)[0] + f"|seed{cell.seed}|{cell.prior}"  # the key without the search
        groups.setdefault(group, (cell, []))[1].append(cell)
    return list(groups.values())


def prune_missing(plan: StudyPlan, missing: list[Cell], done: dict[str, CellResult], save) -> None:
    """Run the missing cells through :func:`pruning.pipeline.prune.prune`, one shared evaluator per group."""
    from pruning.pipeline.prune import prune
    from pruning.runtime.plans import planned_for_device

    config = plan.config
    for first, cells in _group_missing(missing):
        calibration, drop, seed, prior = first.calibration, first.drop, first.seed, first.prior
        by_search = {cell.search: cell for cell in cells}
        if config.progress:
            print(
                f"study: pruning M={drop} under {calibration.objective} on {calibration.data} (seed {seed}, "
                f"{prior} prior): {', '.join(by_search)}",
                flush=True,
            )

        def record(outcome) -> None:
            cell = by_search[outcome.search]
            done[cell.key] = _cell_result(
                cell,
                outcome.removed_blocks,
                outcome.calibration_loss,
                outcome.dense_loss,
                outcome.search_seconds,
                outcome.block_forwards,
                outcome.subset_evaluations,
                outcome.name,
                outcome.checkpoint,
                truncated_items(outcome),
                outcome.options,
            )
            save()

        prune(
            planned_for_device(
                cell_prune_config(config, plan.model, first, tuple(by_search), progress=config.progress),
                sharers=config.workers_per_gpu,
            ),
            on_variant=record,
        )
