"""Registering a ``prune`` run's outcomes: each search's variant scored on held-out data, its checkpoint
written (or reused) and both the base model and the variant recorded in the registry.

:func:`variant_record` makes the registry record of one search's outcome; :func:`register_outcome` scores it
on held-out data, writes its checkpoint and registers it, and returns the :class:`VariantOutcome` that
``prune`` reports (one ``--json`` line).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ground.core.errors import UserError
from ground.planning.devices import device_name
from pruning.pipeline.heldout_selection import HeldOutCache
from pruning.pipeline.plan import PrunePlan
from pruning.pipeline.run import SearchRun
from registry.records import VariantRecord

if TYPE_CHECKING:  # heavy (torch, SQLAlchemy): imported where they are used
    from pruning.calibration.scoring.evaluator import SubsetEvaluator
    from pruning.model.checkpoint import PrunedCheckpoint
    from registry.api import Registry


@dataclass
class VariantOutcome:
    """What ``prune`` reports per search (one ``--json`` line)."""

    id: int | None
    name: str | None
    search: str
    removed_blocks: list[int]
    calibration_loss: float
    dense_loss: float
    search_seconds: float
    block_forwards: int | None
    subset_evaluations: int
    checkpoint: str | None
    seed: int
    options: dict
    head_positions: int | None = None
    stopped_early: int = 0
    shortcuts: bool = True
    validation_loss: float | None = None
    fit: bool | None = None
    selected: bool = False
    quality: dict | None = None
    calibration: dict | None = None
    """The calibration record the variant was registered with (under ``--truncate`` it holds
    ``truncated_items``, the number of items cut to fit)."""


def variant_record(
    plan: PrunePlan, run: SearchRun, dense_loss: float, quality: dict | None = None, truncated: int = 0
) -> VariantRecord:
    """The registry record of one search's variant (its checkpoint not yet written)."""
    calibration = plan.config.calibration.as_record()
    if plan.config.calibration.truncate:
        calibration["truncated_items"] = truncated
    return VariantRecord(
        base_model=plan.model,
        removed_blocks=list(run.result.removed_blocks),
        calibration=calibration,
        quality=quality,
        search=run.search,
        search_options={
            **run.result.options,
            "seed": plan.config.seed,
            "shortcuts": plan.config.shortcuts,
            "cost": {
                "head_positions": run.head_positions,
                "stopped_early": run.stopped_early,
                "device": device_name(plan.config.device, plan.config.gpus),
            },
            "timing": run.timing,
            "prior_charged": run.prior_charged,
            **({"protected": sorted(plan.protected)} if plan.protected else {}),
        },
        calibration_loss=run.result.loss,
        dense_loss=dense_loss,
        search_seconds=run.seconds,
        block_forwards=run.block_forwards,
        subset_evaluations=run.subset_evaluations,
    )


def _checkpoint_for(plan: PrunePlan, search: str, record: VariantRecord) -> PrunedCheckpoint:
    """Write (or reuse, when it already holds this removal set) the checkpoint of one search."""
    from pruning.model.checkpoint import reusable_checkpoint, write_pruned_checkpoint

    directory = plan.checkpoint_dir(search)
    overwrite = plan.config.overwrite
    if not overwrite:
        existing, overwrite = reusable_checkpoint(directory, record.removed_blocks)
        if existing is not None:
            return existing  # a resumed run: the same search already wrote this variant
    return write_pruned_checkpoint(
        plan.model, record.removed_blocks, directory, variant=record, overwrite=overwrite
    )


SEED_INDEPENDENT_OPTIONS = ("prior", "timing", "protected")
"""Search options that must agree for two runs with different seeds to be the same variant's runs."""


def _with_earlier_seeds(registry: Registry, record: VariantRecord) -> dict[str, Any]:
    """``record``'s search options with ``seeds``: every seed that produced this variant.

    The registry keeps one row per (base, removed set, calibration, search), so a search that finds the same
    mask under seeds 0, 1 and 2 (any deterministic search) is one variant whose ``seed`` is the latest run's;
    ``seeds`` keeps the earlier ones, so that a study finds the cell of each seed in the registry."""
    options = dict(record.search_options)
    seeds = {options["seed"]}
    try:
        earlier = registry.list_variants(record.base_model)
    except UserError:  # the base model is new: no earlier run
        earlier = []
    for variant in earlier:
        found = variant.search_options or {}
        if (
            variant.search == record.search
            and variant.removed_blocks == record.removed_blocks
            and variant.calibration == record.calibration
            and all(found.get(key) == options.get(key) for key in SEED_INDEPENDENT_OPTIONS)
        ):
            seeds.update(found.get("seeds", [found.get("seed")]))
    options["seeds"] = sorted(seed for seed in seeds if seed is not None)
    return options


def register_outcome(
    registry: Registry,
    plan: PrunePlan,
    run: SearchRun,
    evaluator: SubsetEvaluator,
    held_out: HeldOutCache,
) -> VariantOutcome:
    """Score one search's outcome on held-out data, write its checkpoint and register it (base model, then
    variant).

    Args:
        registry: where the base model and the variant are registered.
        plan: the run.
        run: the search's outcome.
        evaluator: the calibration evaluator it ran on (its dense loss, its held-out scorers).
        held_out: the run's held-out scorers, one per evaluator.

    Returns:
        What ``prune`` reports of the variant (``selected`` is set once every search has run).
    """
    dense_loss = evaluator.dense_loss()
    quality = held_out(evaluator).quality(run.result.removed_blocks)
    record = variant_record(plan, run, dense_loss, quality, evaluator.truncated_items)
    record = dataclasses.replace(record, search_options=_with_earlier_seeds(registry, record))
    written = _checkpoint_for(plan, run.search, record)
    registry.register_base_model(
        plan.model,
        revision=written.base_revision,
        weights_sha256=written.base_weights_sha256,
        num_blocks=plan.num_blocks,
        architecture=written.architecture,
    )
    # The run's own numbers, also when an earlier run wrote the checkpoint (its pruning.json keeps its own).
    record = dataclasses.replace(
        record,
        checkpoint_path=written.path,
        checkpoint_sha256=written.weights_sha256,
    )
    variant = registry.register_variant(record)
    return VariantOutcome(
        id=variant.id,
        name=variant.name,
        search=run.search,
        removed_blocks=record.removed_blocks,
        calibration_loss=run.result.loss,
        dense_loss=dense_loss,
        search_seconds=round(run.seconds, 3),
        block_forwards=run.block_forwards,
        subset_evaluations=run.subset_evaluations,
        checkpoint=written.path,
        seed=plan.config.seed,
        options=record.search_options,
        head_positions=run.head_positions,
        stopped_early=run.stopped_early,
        shortcuts=plan.config.shortcuts,
        validation_loss=quality["validation_loss"],
        fit=quality["fit"],
        quality=quality,
        calibration=record.calibration,
    )
