"""The study's cells: pruned, evaluated, and kept in the manifest, each computed once.

:func:`prune_missing` runs the cells neither the study's manifest (``cells.json`` in the report directory) nor
the registry already holds through :func:`pruning.pipeline.prune.prune`, one call (one shared evaluator) per
calibration configuration, budget, seed and prior; :func:`evaluate_all` evaluates every variant (and the
dense model) with :mod:`pruning.evaluation` unless the registry already holds those numbers.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from functools import cache, partial
from pathlib import Path
from typing import Any

from depthprune.core.checksums import has_weight_files, released_weights
from depthprune.core.errors import UserError
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
    search_device: str | None = None
    """What ran the search (:func:`depthprune.planning.devices.device_name`): its seconds compare only with
    seconds measured on the same; None: recorded before it was kept."""

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


def find_in_registry(registry, model: str, cell: Cell) -> CellResult | None:
    """A registered variant produced by exactly this cell (calibration, M, search, seed, prior), if any."""
    wanted = cell.calibration.as_record()
    try:
        variants = registry.list_variants(model)
    except UserError:  # base model not registered yet: nothing was pruned
        return None
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


def _evaluations_from_registry(registry, variant, settings, context: int) -> list:
    """The recorded evaluations of ``variant`` made with these settings (by either engine)."""
    # the recorded window is the requested one capped at the engine's context (vLLM keeps one token spare)
    window_lengths = {min(settings.seq_len, context), min(settings.seq_len, context - 1)}
    found = []
    for evaluation in registry.evaluations(variant):
        recorded = evaluation.settings or {}
        if recorded.get("limit") != settings.limit or recorded.get("dtype") != settings.dtype:
            continue
        if recorded.get("num_fewshot", settings.num_fewshot) != settings.num_fewshot:
            continue
        if "seq_len" in recorded and recorded["seq_len"] not in window_lengths:
            continue
        found.append(evaluation)
    return found


def _as_metrics(results) -> dict[str, float]:
    """``task/metric -> value`` of evaluation results or recorded evaluations."""
    return {f"{result.task}/{result.metric}": result.value for result in results}


def evaluate_all(
    plan: StudyPlan, done: dict[str, CellResult], registry, save, *, include_dense: bool = True
) -> dict[str, float]:
    """Evaluate the dense model (unless ``include_dense`` is False) and every distinct variant of ``done``
    not yet evaluated; return the dense metrics (empty without the dense model).

    Variants with byte-identical weights (the same mask found by several searches or seeds, or under both
    objectives) are evaluated once: the others get a copy of those results in the registry, since the
    evaluation depends on the weights and the settings only."""
    from pruning.evaluation.suites import (
        EvalSettings,
        evaluate_model,
        expand_suites,
        prepare_data,
        record_results,
    )
    from pruning.model.blocks import load_config

    config = plan.config
    settings = EvalSettings(
        suites=config.suites,
        engine=config.engine,
        dtype=config.dtype,
        gpus=config.gpus,
        seq_len=config.eval_seq_len,
        limit=config.eval_limit,
        progress=config.progress,
    )
    suites = expand_suites(settings.suites, plan.demo_dir is not None)
    expected = _expected_metric_count(suites)
    context = int(getattr(load_config(plan.model), "max_position_embeddings", 2048))
    targets: dict[str, Any] = {"dense": registry.resolve(plan.model)} if include_dense else {}
    for result in done.values():
        if result.variant and result.variant not in targets:
            targets[result.variant] = registry.resolve(result.variant)
    recorded = {
        name: _evaluations_from_registry(registry, info, settings, context) for name, info in targets.items()
    }
    metrics = {name: _as_metrics(evaluations) for name, evaluations in recorded.items()}
    by_weights: dict[str, list] = {}  # weights sha256 -> complete results of a variant with those weights
    for name, info in targets.items():
        sha256 = getattr(info, "checkpoint_sha256", None)
        if sha256 and len(metrics[name]) >= expected:
            by_weights.setdefault(sha256, recorded[name])
    todo = [name for name in targets if len(metrics[name]) < expected]
    data = cache(partial(prepare_data, suites, plan.demo_dir))  # read once, and only if a model is evaluated

    def evaluate(checkpoint_path: str) -> list:
        return evaluate_model(checkpoint_path, suites, data(), settings)

    for number, name in enumerate(todo, start=1):
        info = targets[name]
        progress = f"{number}/{len(todo)}" if config.progress else None
        results = _copied_or_evaluated(name, info, by_weights, evaluate, progress)
        record_results(registry, info, results)
        metrics[name] = _as_metrics(results)
        for result in done.values():
            if result.variant == name:
                result.metrics = metrics[name]
        save(metrics.get("dense", {}))
    for result in done.values():
        result.metrics = metrics.get(result.variant, result.metrics)
    if config.keep_weights == "none":
        release_evaluated(
            plan, {name: info for name, info in targets.items() if name != "dense"}, metrics, expected
        )
    return metrics.get("dense", {})


def _copied_or_evaluated(
    name: str, info, by_weights: dict[str, list], evaluate, progress: str | None
) -> list:
    """One model's evaluation results: copied from a model with byte-identical weights when there is one,
    else ``evaluate(checkpoint_path)`` (remembered under its weights' sha256). ``progress`` (``"3/7"``) says
    what happens; None prints nothing.

    Raises:
        UserError: the model needs evaluating but its weights were released (``--keep-weights none``).
    """
    from pruning.evaluation.suites import EvalResult

    sha256 = getattr(info, "checkpoint_sha256", None)
    if sha256 in by_weights:
        if progress:
            print(f"study: {name} has the weights of a variant already evaluated; results copied", flush=True)
        return [
            EvalResult(r.suite, r.task, r.metric, r.value, dict(r.settings or {})) for r in by_weights[sha256]
        ]
    if progress:
        print(f"study: evaluating {name} ({progress})", flush=True)
    released = released_weights(info.checkpoint_path)
    if released is not None:
        rebuild = released.get("rebuild", "depthprune checkpoint")
        raise UserError(
            f"{name} needs evaluating under these settings, but its weights were not kept "
            f"(--keep-weights none); write them again with `{rebuild}` and rerun"
        )
    results = evaluate(info.checkpoint_path)
    if sha256:
        by_weights[sha256] = results
    return results


def release_evaluated(plan: StudyPlan, targets: dict[str, Any], metrics: dict, expected: int) -> None:
    """``--keep-weights none``: delete the weight files of every variant whose evaluation is recorded
    (:func:`pruning.model.checkpoint.release_weights`: the directory says how to write them again)."""
    from pruning.model.checkpoint import release_weights

    for name, info in targets.items():
        path = getattr(info, "checkpoint_path", None)
        if not path or len(metrics.get(name, {})) < expected or not Path(path).is_dir():
            continue
        freed = release_weights(path, plan.model, info.removed_blocks, "study --keep-weights none: evaluated")
        if freed and plan.config.progress:
            print(f"study: {name} evaluated; its weights released ({freed / 2**30:.2f} GiB)", flush=True)


def _expected_metric_count(suites: list[str]) -> int:
    """Metrics a complete evaluation on ``suites`` records: fewer means the cell is evaluated (again)."""
    from pruning.evaluation.suites import PERPLEXITY_TASKS, SUITE_PERPLEXITY_TASKS, ZERO_SHOT_TASKS

    count = 0
    if "perplexity" in suites:
        count += len(PERPLEXITY_TASKS)
    if "zero-shot" in suites:
        count += len(ZERO_SHOT_TASKS)  # at least acc per task
    if "demo" in suites:
        count += 3  # demo_text perplexity, demo_qa acc and acc_norm
    if "offline" in suites:
        # its texts' perplexities, pydoc_cloze acc and acc_norm, gcide_define acc (tasks/gcide_define.yaml):
        # a cell evaluated before GCIDE joined the suite has 3 and is evaluated again
        count += len(SUITE_PERPLEXITY_TASKS["offline"]) + 3
    return count
