"""The study's evaluation: every distinct mask (and the dense model) judged once, from the dense weights.

:func:`evaluate_all` evaluates the dense model and every variant of the finished cells unless their numbers
are already recorded under the same settings: in the registry (by variant), or, for a cell the registry does
not know (a manifest written on another machine), in the cell itself (:attr:`CellResult.evaluation`).

With the torch engine a study variant is never loaded from its checkpoint: it is its dense model with the
cell's blocks removed, so :class:`~pruning.evaluation.mask_set.MaskSetEngine` scores every mask from one
loaded dense model, sharing the blocks their prefixes share. Nothing needs restoring when ``--keep-weights
none`` released the weights, and re-judging a finished study on a new suite needs only its manifest. The
vLLM engine loads each variant's checkpoint as before (its weights must be there).

Each cell's metrics hold ``task/metric`` (the study's tables read those), and beside them ``task/n`` and
``task/metric_ci95`` (the 95 % interval of :mod:`pruning.evaluation.intervals`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from functools import cache, partial
from pathlib import Path
from typing import Any

from ground.core.checksums import released_weights
from ground.core.errors import UserError
from pruning.study.plan import StudyPlan

PRIMARY_KEYS = ("perplexity", "acc", "acc_norm")
"""Metrics counted toward a complete evaluation (the ``_ci95`` and ``n`` keys beside them are not)."""

MASKS_PER_PASS = 32
"""Masks one :class:`~pruning.evaluation.mask_set.MaskSetEngine` scores together: a pass's results are
saved before the next starts (an interrupted study loses at most one pass); neighbours in trie order share
most."""


def study_eval_settings(plan: StudyPlan):
    """The :class:`~pruning.evaluation.suites.EvalSettings` of the study's ``--suite``, ``--eval-*``."""
    from pruning.evaluation.suites import EvalSettings

    config = plan.config
    return EvalSettings(
        suites=config.suites,
        engine=config.engine,
        dtype=config.dtype,
        gpus=config.gpus,
        seq_len=config.eval_seq_len,
        limit=config.eval_limit,
        windows=config.eval_windows,
        progress=config.progress,
    )


def evaluation_record(settings) -> dict:
    """What decides a cell's numbers besides its mask: stored with the cell, compared on resume."""
    return {
        "suites": list(settings.suites),
        "dtype": settings.dtype,
        "seq_len": settings.seq_len,
        "limit": settings.limit,
        "windows": settings.windows,
        "num_fewshot": settings.num_fewshot,
    }


def cell_metrics(results) -> dict[str, Any]:
    """``task/metric -> value`` of evaluation results (or recorded evaluations), with ``task/n`` and
    ``task/metric_ci95`` where the result kept its interval."""
    metrics: dict[str, Any] = {}
    for result in results:
        key = f"{result.task}/{result.metric}"
        metrics[key] = result.value
        statistics = (result.settings or {}).get("statistics") or {}
        interval = statistics.get("perplexity_ci95" if result.metric == "perplexity" else "accuracy_ci95")
        if statistics.get("n") is not None:
            metrics[f"{result.task}/n"] = int(statistics["n"])
        if interval:
            metrics[f"{key}_ci95"] = [float(bound) for bound in interval]
    return metrics


def complete(metrics: dict, expected: int) -> bool:
    return sum(1 for key in metrics if key.partition("/")[2] in PRIMARY_KEYS) >= expected


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
        windows = recorded.get("window_limit", recorded.get("limit"))  # recorded before --windows: the limit
        if evaluation.metric == "perplexity" and windows != settings.window_cap:
            continue
        found.append(evaluation)
    return found


def _known(registry, name: str):
    """The registry's record of ``name``; None when it holds none (a manifest written elsewhere)."""
    try:
        return registry.resolve(name)
    except UserError:
        return None


def _dense_info(registry, model: str):
    """The dense model's registry record (a local model the registry does not know yet is registered)."""
    from pruning.evaluation.suites import resolve_targets

    try:
        return resolve_targets([model], registry)[0].variant
    except UserError:  # a hub model never pruned here: its numbers live in the manifest only
        return None


@dataclasses.dataclass
class _Target:
    """One model to judge: its mask, where its numbers go (registry record, cells), and whether they exist."""

    mask: tuple[int, ...]
    info: Any = None
    cells: list = dataclasses.field(default_factory=list)
    metrics: dict = dataclasses.field(default_factory=dict)
    recorded: list = dataclasses.field(default_factory=list)
    """The registry's evaluations under these settings (copied to a model with the same weights)."""

    @property
    def healed(self) -> bool:
        """A healed child: its own weights, only its mask its parent's (judged from its checkpoint)."""
        return getattr(self.info, "parent", None) is not None

    @property
    def weights(self) -> tuple:
        """What its numbers depend on besides the settings: the mask, or a healed child's own weights."""
        if self.healed:
            return ("weights", getattr(self.info, "checkpoint_sha256", None) or self.info.name)
        return ("mask", self.mask)


def evaluate_all(
    plan: StudyPlan, done: dict, registry, save, *, include_dense: bool = True
) -> dict[str, float]:
    """Evaluate the dense model (unless ``include_dense`` is False) and every distinct variant of ``done``
    not yet evaluated under these settings; return the dense metrics (empty without the dense model).

    Variants with the same mask (found by several searches or seeds, or under several objectives) are
    evaluated once: the others get a copy of those results, since the numbers depend on the weights and the
    settings only.

    Raises:
        UserError: a variant must be evaluated from its checkpoint (the vLLM engine) but its weights were
            released or are not on this machine.
    """
    from pruning.evaluation.suites import expand_suites
    from pruning.model.blocks import load_config

    settings = study_eval_settings(plan)
    suites = expand_suites(settings.suites, plan.demo_dir is not None)
    expected = _expected_metric_count(suites)
    record = evaluation_record(settings)
    context = int(getattr(load_config(plan.model), "max_position_embeddings", 2048))
    targets = _targets(plan, done, registry, include_dense)
    for target in targets.values():
        if target.info is not None:
            target.recorded = _evaluations_from_registry(registry, target.info, settings, context)
            target.metrics = cell_metrics(target.recorded)
        elif target.cells and all(cell.evaluation == record for cell in target.cells):
            target.metrics = dict(target.cells[0].metrics)
    todo = {name: target for name, target in targets.items() if not complete(target.metrics, expected)}
    copies = {
        target.weights: target.recorded
        for target in targets.values()
        if target.recorded and complete(target.metrics, expected)
    }

    def finished(name: str, results: list) -> None:
        target = targets[name]
        if target.info is not None:
            from pruning.evaluation.suites import record_results

            record_results(registry, target.info, results)
        target.metrics = cell_metrics(results)
        for cell in target.cells:
            cell.metrics, cell.evaluation = dict(target.metrics), record
        save(targets["dense"].metrics if "dense" in targets else {})

    for name in [name for name, target in todo.items() if target.weights in copies]:
        finished(name, _copies(copies[todo.pop(name).weights]))
    if todo:
        _evaluate(plan, todo, suites, settings, finished)
    for target in targets.values():
        for cell in target.cells:
            cell.metrics = dict(target.metrics)
            cell.evaluation = record if complete(target.metrics, expected) else cell.evaluation
    if plan.config.keep_weights == "none":
        release_evaluated(plan, targets, expected)
    return targets["dense"].metrics if "dense" in targets else {}


def _targets(plan: StudyPlan, done: dict, registry, include_dense: bool) -> dict[str, _Target]:
    """The models to judge by name: ``dense``, then each variant of ``done`` (its cells attached)."""
    targets: dict[str, _Target] = {}
    if include_dense:
        targets["dense"] = _Target((), _dense_info(registry, plan.model))
    for result in done.values():
        if not result.variant:
            continue
        if result.variant not in targets:
            targets[result.variant] = _Target(
                tuple(sorted(result.removed_blocks)), _known(registry, result.variant)
            )
        targets[result.variant].cells.append(result)
    return targets


def _evaluate(plan: StudyPlan, todo: dict[str, _Target], suites, settings, finished) -> None:
    """Judge every model of ``todo``: by mask from the dense weights (torch), else from each checkpoint."""
    from pruning.evaluation.suites import prepare_data
    from pruning.runtime.engine_choice import resolve_engine

    data = cache(partial(prepare_data, suites, plan.demo_dir))  # read once, and only if a model is evaluated
    progress = plan.config.progress
    by_checkpoint = dict(todo)
    if resolve_engine(settings.engine) == "torch":
        by_mask = {name: target for name, target in todo.items() if not target.healed}
        _evaluate_by_mask(plan, by_mask, suites, data, settings, finished)
        by_checkpoint = {name: target for name, target in todo.items() if target.healed}
    from pruning.evaluation.suites import evaluate_model

    evaluated: dict[tuple, list] = {}
    for number, (name, target) in enumerate(by_checkpoint.items(), start=1):
        if target.weights in evaluated:
            finished(name, _copies(evaluated[target.weights]))
            continue
        if progress:
            print(f"study: evaluating {name} ({number}/{len(by_checkpoint)})", flush=True)
        path = plan.model if name == "dense" else getattr(target.info, "checkpoint_path", None)
        if name != "dense":
            _check_weights(name, path)
        evaluated[target.weights] = evaluate_model(path, suites, data(), settings)
        finished(name, evaluated[target.weights])


def _evaluate_by_mask(plan: StudyPlan, todo: dict[str, _Target], suites, data, settings, finished) -> None:
    """:class:`~pruning.evaluation.mask_set.MaskSetEngine` passes of :data:`MASKS_PER_PASS` masks in trie
    order; each mask's results go to every model with that mask."""
    from ground.planning.devices import resolve_device
    from pruning.calibration.scoring.shortcuts import trie_order
    from pruning.evaluation.mask_set import MaskSetEngine
    from pruning.evaluation.suites import evaluate_with_engine
    from pruning.runtime.isolation import release_device_memory

    names_of: dict[tuple[int, ...], list[str]] = {}
    first: set[tuple[int, ...]] = set()
    for name, target in todo.items():
        names_of.setdefault(target.mask, []).append(name)
        if name == "dense" or any(_like_the_paper(plan, cell) for cell in target.cells):
            first.add(target.mask)
    # the dense model and the paper's budgets and objectives first: a run stopped early has what the
    # reading compares with the paper
    masks = trie_order([m for m in names_of if m in first], plan.num_blocks)
    masks = [*masks[-1:], *masks[:-1]] if () in first else masks  # dense sorts last in a trie: move it up
    masks += trie_order([m for m in names_of if m not in first], plan.num_blocks)
    device = resolve_device(settings.device)
    for start in range(0, len(masks), MASKS_PER_PASS):
        chunk = masks[start : start + MASKS_PER_PASS]
        if plan.config.progress:
            print(
                f"study: evaluating masks {start + 1}-{start + len(chunk)} of {len(masks)} from the dense "
                "weights, prefixes shared",
                flush=True,
            )
        release_device_memory()  # what pruning left in torch's cache would look taken to the state budget
        engine = MaskSetEngine(plan.model, chunk, dtype=settings.dtype, device=device, gpus=settings.gpus)
        try:
            for mask in chunk:
                results = evaluate_with_engine(engine.view(mask), suites, data(), settings)
                for name in names_of[mask]:
                    finished(name, _copies(results))
        finally:
            engine.close()


def _like_the_paper(plan: StudyPlan, cell) -> bool:
    """A cell at one of the paper's budgets under one of its objectives."""
    from pruning.study.paper import PAPER, paper_budgets

    return cell.drop in paper_budgets(plan.num_blocks) and cell.objective in PAPER.objectives


def _copies(results: Sequence) -> list:
    from pruning.evaluation.suites import EvalResult

    return [EvalResult(r.suite, r.task, r.metric, r.value, dict(r.settings or {})) for r in results]


def _check_weights(name: str, path: str | None) -> None:
    if not path or not Path(path).is_dir():
        raise UserError(
            f"{name} needs evaluating, but its checkpoint is not on this machine; evaluate from the dense "
            "weights with --engine torch"
        )
    released = released_weights(path)
    if released is not None:
        rebuild = released.get("rebuild", "depthprune checkpoint")
        raise UserError(
            f"{name} needs evaluating under these settings, but its weights were not kept "
            f"(--keep-weights none); evaluate from the dense weights with --engine torch, or write them "
            f"again with `{rebuild}` and rerun"
        )


def release_evaluated(plan: StudyPlan, targets: dict[str, _Target], expected: int) -> None:
    """``--keep-weights none``: delete the weight files of every variant whose evaluation is recorded
    (:func:`pruning.model.checkpoint.release_weights`: the directory says how to write them again)."""
    from pruning.model.checkpoint import release_weights

    for name, target in targets.items():
        path = getattr(target.info, "checkpoint_path", None)
        if name == "dense" or target.healed or not path or not Path(path).is_dir():
            continue  # a healed child cannot be written again from its mask
        if not complete(target.metrics, expected):
            continue
        freed = release_weights(path, plan.model, list(target.mask), "study --keep-weights none: evaluated")
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
