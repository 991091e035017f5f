"""Healing in the study: does the search, or the calibration, still matter once the variants are healed?

``depthprune study ... --heal lora:200`` (or ``distill:200``) runs here after the grid is pruned and
evaluated:

1. :func:`heal_study` heals every *distinct* removal set of the study's cells once, with
   :func:`pruning.healing.heal` and its defaults (learning rate, LoRA rank, batch size; windows of at most
   the study's ``--seq-len`` tokens), on ``--heal-data`` (default: the study's text calibration data). The
   healed variant's parent is the first cell's variant with that mask; cells sharing the mask share the
   healed variant. Healing trains on the data's ``heal`` split (or ``calibration`` split) and measures its
   held-out loss on the ``test`` split, so it never trains on what the evaluation measures, and ``heal``
   refuses text whose training and held-out documents are the same.
2. A healed variant already in the registry (a child of one of the mask's variants, healed with the same
   settings) is reused: a re-run heals nothing again, and its evaluations come from the registry too.
3. The healed variants are evaluated exactly as the study evaluates the pruned ones
   (:func:`pruning.study.evaluation.evaluate_all`).
4. :func:`healing_sections` adds the report's healing sections: accuracy and perplexity before vs after per
   search, the inter-search spread σ² before vs after, and how far accuracy moves with the calibration vs
   with the search before vs after healing, with a sentence that answers the question.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pruning.study.evaluation import evaluate_all
from pruning.study.paths import recorded_path
from pruning.study.plan import DEFAULT_DATA, STUDY_HEAL_MAX_SEQ_LEN, HealOption, parse_heal_option


@dataclass
class HealedVariant:
    """The healed variant of one distinct mask, as the report uses it."""

    name: str
    """Registry name of the healed variant."""
    parent: str
    """Registry name of the pruned variant it was healed from."""
    checkpoint: str
    """Its checkpoint directory."""
    removed_blocks: list[int]
    """The mask it shares with its parent."""
    healing: dict
    """Its registry ``healing`` record (settings, losses, wall time)."""
    metrics: dict[str, float] = field(default_factory=dict)
    """``"task/metric" -> value`` of the study's evaluation."""


@dataclass
class StudyHealing:
    """What :func:`heal_study` produced: the settings and, per cell key, the cell's healed variant."""

    method: str
    steps: int
    data: str
    """The text spec healed on."""
    by_cell: dict[str, HealedVariant]
    """Cell key -> the healed variant of its mask (shared by the cells with that mask)."""
    healed_now: list[str] = field(default_factory=list)
    """Names of the variants this run trained (the others came from the registry)."""


def heal_data_spec(plan) -> str:
    """``--heal-data``, else the study's first text calibration spec, else the demo text or C4."""
    from pruning.calibration.data.items import TEXT
    from pruning.calibration.data.specs import parse_spec

    if plan.config.heal_data:
        return plan.config.heal_data
    for cell in plan.cells:
        if parse_spec(cell.calibration.data).kind == TEXT:
            return cell.calibration.data
    return f"demo:text@{plan.demo_dir}" if plan.demo_dir is not None else DEFAULT_DATA["text"]


def _heal_config(plan, option: HealOption, data: str, parent: str):
    from pruning.healing.config import HealConfig

    config = plan.config
    return HealConfig(
        variant=parent,
        data=data,
        method=option.method,
        steps=option.steps,
        seq_len=min(STUDY_HEAL_MAX_SEQ_LEN, config.seq_len or STUDY_HEAL_MAX_SEQ_LEN),
        device=config.device,
        gpus=config.gpus,
        dtype=config.dtype,
        registry_url=config.registry_url,
        out=config.checkpoints,
        progress=config.progress,
    )


def _canonical(settings: dict) -> str:
    return json.dumps(settings, sort_keys=True, default=str)


def _registered_healed(registry, parents: Sequence[str], settings: dict):
    """A healed child of one of ``parents``, healed with exactly ``settings``, whose checkpoint exists."""
    from registry.records import HEALING_MEASUREMENTS

    wanted = _canonical(settings)
    for parent in parents:
        for child in registry.healed_from(parent):
            asked = {
                key: value for key, value in (child.healing or {}).items() if key not in HEALING_MEASUREMENTS
            }
            if _canonical(asked) == wanted and child.checkpoint_path and Path(child.checkpoint_path).is_dir():
                return child
    return None


def _masks(plan, done: dict) -> dict[tuple[int, ...], list[str]]:
    """Each distinct mask -> the variants with it, in grid order (the first is the parent to heal)."""
    masks: dict[tuple[int, ...], list[str]] = {}
    for cell in plan.cells:
        result = done.get(cell.key)
        if result is not None and result.variant:
            variants = masks.setdefault(tuple(result.removed_blocks), [])
            if result.variant not in variants:
                variants.append(result.variant)
    return masks


def heal_study(plan, done: dict, registry) -> StudyHealing:
    """Heal every distinct mask of ``done`` once (reusing registered healed variants) and evaluate them.

    Args:
        plan: the :class:`~pruning.study.plan.StudyPlan` (``config.heal`` set).
        done: cell key -> :class:`~pruning.study.cells.CellResult`, every cell finished.
        registry: the open registry.

    Returns:
        The healed variant of each cell, with its metrics.
    """
    from pruning.healing.heal import heal, plan_heal

    option, data = parse_heal_option(plan.config.heal), heal_data_spec(plan)
    masks = _masks(plan, done)
    if not masks:
        return StudyHealing(option.method, option.steps, data, {})
    # the settings do not depend on the parent (same tokenizer, data and context for every variant)
    settings = plan_heal(_heal_config(plan, option, data, next(iter(masks.values()))[0]), registry).settings
    by_mask: dict[tuple[int, ...], HealedVariant] = {}
    healed_now = []
    for number, (mask, parents) in enumerate(masks.items(), start=1):
        found = _registered_healed(registry, parents, settings)
        if found is None:
            if plan.config.progress:
                print(
                    f"study: healing {parents[0]} ({number}/{len(masks)}) with {plan.config.heal}", flush=True
                )
            heal(_heal_config(plan, option, data, parents[0]))
            found = _registered_healed(registry, parents[:1], settings)
            if found is None:  # heal registered it under these settings: anything else is a bug
                raise RuntimeError(f"the healed variant of {parents[0]} is not in the registry")
            healed_now.append(found.name)
        by_mask[mask] = HealedVariant(
            found.name, found.parent, found.checkpoint_path, list(mask), dict(found.healing)
        )
    by_cell = {
        key: by_mask[tuple(result.removed_blocks)]
        for key, result in done.items()
        if result.variant and tuple(result.removed_blocks) in by_mask
    }
    _evaluate(plan, done, by_cell, registry)
    return StudyHealing(option.method, option.steps, data, by_cell, healed_now)


def _evaluate(plan, done: dict, by_cell: dict[str, HealedVariant], registry) -> None:
    """Evaluate the healed variants as the study evaluates the pruned ones (registry numbers reused)."""

    as_cells = {
        key: dataclasses.replace(
            done[key], variant=healed.name, checkpoint=healed.checkpoint, metrics={}, evaluation=None
        )
        for key, healed in by_cell.items()
    }
    evaluate_all(plan, as_cells, registry, lambda *_: None, include_dense=False)
    for key, healed in by_cell.items():
        healed.metrics = as_cells[key].metrics


# ------------------------------------------------------------------------------------------------- report


def _mean(values: Sequence[float]) -> float:
    known = [value for value in values if not math.isnan(value)]
    return sum(known) / len(known) if known else math.nan


def _views(summary: dict, cells: Sequence, dense: dict, healing: StudyHealing):
    """The study's view of the healed cells before healing, and the same cells with the healed metrics."""
    from pruning.study.tables import StudyView

    healed = [cell for cell in cells if cell.key in healing.by_cell]
    after = [dataclasses.replace(cell, metrics=healing.by_cell[cell.key].metrics) for cell in healed]
    return StudyView(summary, healed, dense), StudyView(summary, after, dense)


def _per_variant_section(before, after, healing: StudyHealing):
    from pruning.study.tables import Section, fmt

    after_by_key = {cell.key: cell for cell in after.cells}
    rows = []
    for cell in before.main_ordered:
        healed, metrics = healing.by_cell[cell.key], after_by_key[cell.key].metrics
        acc_before, acc_after = before.mean_acc(cell.metrics), after.mean_acc(metrics)
        rows.append(
            [*before.row_name(cell), healed.name]
            + [fmt(before.avg_ppl(cell.metrics), 2), fmt(after.avg_ppl(metrics), 2)]
            + [fmt(acc_before, 2), fmt(acc_after, 2), fmt(acc_after - acc_before, 2)]
            + [fmt(healed.healing.get("parent_heldout_loss"), 4), fmt(healed.healing.get("heldout_loss"), 4)]
        )
    return Section(
        f"Healing ({healing.method}, {healing.steps} steps): each search before vs after",
        [
            f"Every distinct mask healed once with `depthprune heal --method {healing.method} --steps "
            f"{healing.steps}` on `{healing.data}` (its heal or calibration split; the held-out loss on its "
            "test split), then evaluated as the pruned variants are; cells with the same mask share the "
            f"healed variant. {before.metric_sentence}"
        ],
        ["calibration", "M", "search", *before.seed_column, "healed variant"]
        + [f"{before.avg_header} before", "after", f"{before.mean_acc_header} before", "after", "Δ acc"]
        + ["held-out loss before", "after"],
        rows,
    )


def _spread_rows(before, after) -> tuple[list[list[str]], dict]:
    """Per search group and cell: σ² of Avg perplexity and mean accuracy across the searches, both sides."""
    from pruning.study import statistics as study_stats
    from pruning.study.tables import fmt

    after_by_key = {cell.key: cell for cell in after.cells}
    rows, means = [], {}
    for group in before.groups:
        variances: dict[str, list[float]] = {
            "acc_before": [],
            "acc_after": [],
            "ppl_before": [],
            "ppl_after": [],
        }
        for (name, drop, seed), members in before.searches_by_cell(group).items():
            ppl_before, acc_before = before.group_quality(members)
            ppl_after, acc_after = after.group_quality([after_by_key[cell.key] for cell in members])
            row = {
                "ppl_before": study_stats.inter_method_variance(ppl_before),
                "ppl_after": study_stats.inter_method_variance(ppl_after),
                "acc_before": study_stats.inter_method_variance(acc_before),
                "acc_after": study_stats.inter_method_variance(acc_after),
            }
            for key, value in row.items():
                variances[key].append(value)
            best = [_best_search(members, acc_before), _best_search(members, acc_after)]
            rows.append(
                [before.group_label(group), name, str(drop), *before.seed_entry(seed), str(len(members))]
                + [fmt(row[key], 4) for key in ("ppl_before", "ppl_after", "acc_before", "acc_after")]
                + best
            )
        means[group] = {key: _mean(values) for key, values in variances.items()}
    return rows, means


def _best_search(members: Sequence, accuracies: Sequence[float]) -> str:
    known = [
        (value, cell.search) for cell, value in zip(members, accuracies, strict=True) if not math.isnan(value)
    ]
    return max(known)[1] if known else "–"


def _spread_section(before, after) -> tuple:
    from pruning.study.tables import Section

    rows, means = _spread_rows(before, after)
    section = Section(
        "Healing: inter-search spread σ² before vs after",
        [
            "Population variance across the searches of one calibration configuration and budget, before "
            "and after healing every variant; accuracy in points², perplexity in ppl². The best search is "
            f"the one with the highest {before.mean_acc_header}."
        ],
        ["searches", "calibration", "M", *before.seed_column, "n"]
        + [
            f"σ² {before.avg_header} before",
            "after",
            f"σ² mean {before.metric_name} (points²) before",
            "after",
        ]
        + ["best search before", "after"],
        rows,
    )
    return section, means


def _movement(view, quality) -> dict:
    """Per search group and budget: |Δ quality| across configurations vs across searches (``quality``:
    the view's ``mean_acc`` or ``avg_ppl``)."""
    from pruning.study import statistics as study_stats

    results = {}
    for group, searches in view.groups.items():
        results[group] = {}
        for drop in view.budgets():
            values = {
                (view.label[cell.key], cell.search, cell.drop, cell.seed): quality(cell.metrics)
                for cell in view.main
                if cell.search in searches and (drop == "all" or cell.drop == drop)
            }
            results[group][str(drop)] = study_stats.accuracy_movement(values)
    return results


def _movement_section(before, after) -> tuple:
    from pruning.study.tables import Section, fmt

    moved = {
        (side, what): _movement(view, getattr(view, what))
        for side, view in (("before", before), ("after", after))
        for what in ("mean_acc", "avg_ppl")
    }
    rows = []
    for group, by_drop in moved["before", "mean_acc"].items():
        for drop in by_drop:
            entries = []
            for what, digits in (("mean_acc", 2), ("avg_ppl", 2)):
                for side in ("before", "after"):
                    result = moved[side, what][group][drop]
                    entries += [
                        fmt(result.across_configurations_mean, digits),
                        fmt(result.across_searches_mean, digits),
                    ]
            rows.append([drop, before.group_label(group), *entries])
    numbers = {
        f"{what}_{side}": {
            group: {drop: dataclasses.asdict(result) for drop, result in by_drop.items()}
            for group, by_drop in by_group.items()
        }
        for (side, what), by_group in moved.items()
    }
    section = Section(
        "Healing: calibration effect vs search effect before vs after",
        [
            "Mean absolute difference between two variants that differ only in the calibration "
            "configuration (same search, M, seed) and between two that differ only in the search (same "
            f"configuration, M, seed): of the {before.mean_acc_header} in points, and of the "
            f"{before.avg_header}, before and after healing (§5.2's comparison, repeated on the healed "
            "variants)."
        ],
        ["M", "searches"]
        + ["Δ acc, calibration changes, before", "Δ acc, search changes, before"]
        + ["Δ acc, calibration changes, after", "Δ acc, search changes, after"]
        + ["Δ ppl, calibration changes, before", "Δ ppl, search changes, before"]
        + ["Δ ppl, calibration changes, after", "Δ ppl, search changes, after"],
        rows,
    )
    return section, numbers


def _answer(movement: dict, spread: dict, healing: StudyHealing) -> str:
    """The sentence the healing sections answer: does the search, or the calibration, still matter?"""
    from pruning.study.tables import fmt

    if not movement["mean_acc_before"]:
        return "No accuracy was measured, so the question cannot be answered from this study."
    group = next(iter(movement["mean_acc_before"]))
    budget = list(movement["mean_acc_before"][group])[-1]
    before, after = movement["mean_acc_before"][group][budget], movement["mean_acc_after"][group][budget]
    calibration_after, search_after = after["across_configurations_mean"], after["across_searches_mean"]
    text = (
        f"Over the {group} searches at M = {budget}: changing the calibration moved the mean accuracy by "
        f"{fmt(before['across_configurations_mean'], 2)} points before healing and "
        f"{fmt(calibration_after, 2)} after; changing the search moved it by "
        f"{fmt(before['across_searches_mean'], 2)} before and {fmt(search_after, 2)} after "
        f"({healing.method}, {healing.steps} steps). The spread across searches (σ² of the mean accuracy, "
        f"averaged over cells) went from {fmt(spread[group]['acc_before'], 2)} to "
        f"{fmt(spread[group]['acc_after'], 2)} points². "
    )
    if math.isnan(calibration_after) or math.isnan(search_after):
        return text + "The study varied only one of the two, so their effects cannot be compared."
    if calibration_after > search_after:
        return text + "After healing, the calibration still matters more than the search."
    if search_after > calibration_after:
        return text + "After healing, the search matters more than the calibration."
    return text + "After healing, the calibration and the search matter equally."


def healing_sections(summary: dict, cells: Sequence, dense: dict, healing: StudyHealing) -> tuple[list, dict]:
    """The report's healing sections and their numbers (``study.json``'s ``healing``).

    Args:
        summary: the study's setup (:func:`pruning.study.plan.plan_summary`).
        cells: the finished cells, metrics filled in (the pruned variants').
        dense: the dense model's metrics.
        healing: what :func:`heal_study` produced.

    Returns:
        The sections (the answer, each search before vs after, the spread σ², the calibration vs search
        effect) and a JSON-ready dict of the settings, the healed variants and the statistics.
    """
    from pruning.study.tables import Section

    before, after = _views(summary, cells, dense, healing)
    spread_section, spread = _spread_section(before, after)
    movement_section, movement = _movement_section(before, after)
    answer = Section(
        "Healing: does the search, or the calibration, still matter?", [_answer(movement, spread, healing)]
    )
    numbers = {
        "method": healing.method,
        "steps": healing.steps,
        "data": healing.data,
        "variants": {
            key: {
                **dataclasses.asdict(healed),
                "removed_blocks": list(healed.removed_blocks),
                "checkpoint": recorded_path(healed.checkpoint),
            }
            for key, healed in healing.by_cell.items()
        },
        "spread": spread,
        "movement": movement,
    }
    return [answer, _per_variant_section(before, after, healing), spread_section, movement_section], numbers
