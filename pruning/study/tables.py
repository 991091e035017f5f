"""The study report's sections: one function per table, all reading one :class:`StudyView` of the cells.

:func:`build_sections` runs every function of :data:`SECTIONS` in order and returns the sections that apply
(the seed-stability and random-prior tables only when the study ran them) with the numbers that
``study.json`` keeps. :mod:`pruning.study.report` renders the sections; :mod:`pruning.study.figures` draws
from the same view.

Conventions, as the paper (arXiv 2604.24938) reports its numbers:

* **Accuracy** of a task is the metric the paper reports for it
  (:data:`pruning.evaluation.suites.PRIMARY_METRICS`: ``acc_norm`` for HellaSwag, ARC-E, ARC-C and PIQA,
  ``acc`` for WinoGrande and BoolQ; ``acc_norm`` for the project's ``demo_qa`` and ``pydoc_cloze``), in
  points (percent); the mean accuracy is the mean over the tasks measured. Every header names the metric.
* **Avg perplexity** is the mean of the WikiText-2, C4 and LAMBADA perplexities (Table 1's Avg); a study
  that measured none of them (demo, offline) averages the perplexities it has, and the header says which.
  Spearman ρ and the trade-off figure rank variants by it.
* **σ²** of accuracy is in points² (the paper's 0.69 for LLaMA3 margin at M=9), of perplexity in ppl².
* **Search groups**: per-cell statistics (agreement, σ², ρ, accuracy movement) are computed over the paper's
  seven searches that ran (``study``, n = 7 with ``--searches study``) and, when more ran (the structural
  baselines with ``--searches all``), again over every search (``all``); both are shown.

The statistics come from :mod:`pruning.study.statistics`.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from functools import cached_property
from pathlib import Path

from pruning.evaluation.suites import ZERO_SHOT_TASKS, primary_metric
from pruning.study import statistics as study_stats
from pruning.study.cost_notes import machines_sentence, protection_sentence, timing_accounting

PAPER_PERPLEXITY = ("wikitext2", "c4", "lambada")
"""The perplexities whose mean is Table 1's Avg."""
PERPLEXITY_ORDER = (*PAPER_PERPLEXITY, "demo_text", "pydoc")
ACCURACY_ORDER = (*ZERO_SHOT_TASKS, "demo_qa", "pydoc_cloze")


def model_name(summary: dict) -> str:
    """The model as the user named it (reports written before it was kept: its directory's name)."""
    return summary.get("model_name") or Path(str(summary.get("model", "model"))).name


# ------------------------------------------------------------------------------------------ cell helpers


def short_data(spec: str) -> str:
    """``demo:text@/long/path`` -> ``demo:text``; paths shortened to their file name."""
    name = spec.split("@", 1)[0]
    if name.startswith(("text:", "mc:", "commonsense170k:")):
        prefix, _, path = name.partition(":")
        return f"{prefix}:{Path(path).name}"
    return name


def calibration_label(cell, multiple_data: bool) -> str:
    """The objective, plus the data source when some objective runs on several."""
    return f"{cell.objective} on {short_data(cell.data)}" if multiple_data else cell.objective


def _ordered(tasks: set[str], order: Sequence[str]) -> list[str]:
    return [t for t in order if t in tasks] + sorted(tasks - set(order))


def perplexity_tasks(metrics_list: Sequence[dict]) -> list[str]:
    """Perplexity tasks measured anywhere, the paper's first."""
    tasks = {key.split("/")[0] for metrics in metrics_list for key in metrics if key.endswith("/perplexity")}
    return _ordered(tasks, PERPLEXITY_ORDER)


def accuracy_metrics(metrics_list: Sequence[dict]) -> dict[str, str]:
    """Task -> its reported accuracy metric (:func:`~pruning.evaluation.suites.primary_metric`), for every
    task with an accuracy measured anywhere, in the paper's task order."""
    measured: dict[str, set[str]] = defaultdict(set)
    for metrics in metrics_list:
        for key in metrics:
            task, _, metric = key.partition("/")
            if metric in ("acc", "acc_norm"):
                measured[task].add(metric)
    return {
        task: primary_metric(task, sorted(measured[task])) for task in _ordered(set(measured), ACCURACY_ORDER)
    }


def accuracy_points(metrics: dict, task: str, metric: str) -> float:
    """``task``'s ``metric`` in points (percent); NaN when not measured."""
    value = metrics.get(f"{task}/{metric}")
    return math.nan if value is None else 100.0 * value


def mean_accuracy(metrics: dict, task_metrics: dict[str, str]) -> float:
    """Mean accuracy in points over ``task -> metric`` (NaN when one is missing)."""
    values = [accuracy_points(metrics, task, metric) for task, metric in task_metrics.items()]
    if not values or any(math.isnan(value) for value in values):
        return math.nan
    return sum(values) / len(values)


def average_perplexity(metrics: dict, tasks: Sequence[str]) -> float:
    """Mean of the perplexities of ``tasks`` (NaN when one is missing)."""
    values = [metrics.get(f"{task}/perplexity") for task in tasks]
    if not values or any(value is None for value in values):
        return math.nan
    return sum(values) / len(values)


def fmt(value, digits: int = 3) -> str:
    """A table entry: ``–`` for a missing value, thousands separated, ``digits`` decimals below 1000."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, int):
        return f"{value:,}"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.{digits}f}"


def _mask(removed: Sequence[int], num_blocks: int) -> str:
    removed = set(removed)
    return "".join("■" if i in removed else "□" for i in range(num_blocks))


def _largest(values):
    known = [v for v in values if v is not None]
    return max(known) if known else None


def _average(values):
    known = [v for v in values if v is not None and not math.isnan(v)]
    return sum(known) / len(known) if known else math.nan


# ----------------------------------------------------------------------------------------- the view


class StudyView:
    """What every table and figure derives from the finished cells, computed once.

    Args:
        summary: the study's setup (:func:`pruning.study.plan.plan_summary`).
        cells: finished cells (:class:`pruning.study.cells.CellResult`), metrics filled in.
        dense: the dense model's metrics, ``"task/metric" -> value``.
    """

    def __init__(self, summary: dict, cells: Sequence, dense: dict):
        self.summary, self.cells, self.dense = summary, cells, dense
        self.num_blocks: int = summary["num_blocks"]
        self.model_name = model_name(summary)
        objectives_data = defaultdict(set)
        for cell in cells:
            objectives_data[cell.objective].add(cell.data)
        self.multiple_data = any(len(data) > 1 for data in objectives_data.values())
        self.label = {cell.key: calibration_label(cell, self.multiple_data) for cell in cells}
        self.main = [cell for cell in cells if cell.prior == "single_block"]
        """Cells searched under the single-block prior (the study proper), in the given order."""
        self.all_metrics = [dense] + [cell.metrics for cell in cells]
        self.ppl_tasks = perplexity_tasks(self.all_metrics)
        self.avg_tasks = [t for t in PAPER_PERPLEXITY if t in self.ppl_tasks] or list(self.ppl_tasks)
        """The perplexities averaged into Avg: the paper's three when measured, else every one measured."""
        self.acc_metrics = accuracy_metrics(self.all_metrics)
        """Task -> its reported metric (acc_norm or acc)."""
        self.acc_tasks = list(self.acc_metrics)
        self.several_seeds = len(summary["seeds"]) > 1
        self.seed_column = ["seed"] if self.several_seeds else []
        self.ordered = sorted(
            cells,
            key=lambda c: (self.label[c.key], c.drop, c.prior, self.search_position(c.search), c.seed),
        )
        """Every cell in table order: calibration, M, prior, search (as listed in the study), seed."""
        self.main_ordered = [cell for cell in self.ordered if cell.prior == "single_block"]

    def search_position(self, search: str) -> int:
        """Where a search is listed in the study (unlisted ones last)."""
        searches = self.summary["searches"]
        return searches.index(search) if search in searches else 99

    # ------------------------------------------------------------------------------ metrics

    def avg_ppl(self, metrics: dict) -> float:
        """Avg perplexity of ``metrics`` (NaN when one of :attr:`avg_tasks` is missing)."""
        return average_perplexity(metrics, self.avg_tasks)

    def mean_acc(self, metrics: dict) -> float:
        """Mean accuracy of ``metrics`` in points over the reported metrics (NaN when one is missing)."""
        return mean_accuracy(metrics, self.acc_metrics)

    @property
    def avg_header(self) -> str:
        """The Avg column's header: which perplexities it averages."""
        if self.avg_tasks == list(PAPER_PERPLEXITY):
            return "Avg ppl (wikitext2, c4, lambada)"
        only = "" if len(self.avg_tasks) > 1 else ", the only one measured"
        return f"Avg ppl ({', '.join(self.avg_tasks)}{only})"

    @property
    def metric_name(self) -> str:
        """``acc_norm``, ``acc`` or ``acc_norm/acc``: the metrics behind the mean accuracy."""
        names = sorted(set(self.acc_metrics.values()), reverse=True)
        return "/".join(names) if names else "acc"

    @property
    def mean_acc_header(self) -> str:
        return f"mean {self.metric_name} (%)"

    def acc_header(self, task: str) -> str:
        return f"{task} {self.acc_metrics[task]} (%)"

    @property
    def metric_sentence(self) -> str:
        """Which metric each accuracy task reports, for the section texts."""
        by_metric = defaultdict(list)
        for task, metric in self.acc_metrics.items():
            by_metric[metric].append(task)
        parts = [
            f"`{metric}` for {', '.join(tasks)}" for metric, tasks in sorted(by_metric.items(), reverse=True)
        ]
        return "Accuracy in points (%): " + ("; ".join(parts) or "no task measured") + "."

    # ------------------------------------------------------------------------------ groups

    @cached_property
    def groups(self) -> dict[str, tuple[str, ...]]:
        """Search group -> searches: ``study`` (the paper's seven that ran) and, when more ran, ``all``."""
        from pruning.search import STUDY_SEARCHES

        ran = [s for s in self.summary["searches"] if any(c.search == s for c in self.main)]
        study = tuple(s for s in ran if s in STUDY_SEARCHES)
        groups = {"study": study} if study else {}
        if len(ran) > len(study):
            groups["all"] = tuple(ran)
        return groups

    def group_label(self, group: str) -> str:
        return f"{group} ({len(self.groups[group])})"

    def searches_by_cell(self, group: str) -> dict[tuple, list]:
        """The searches of ``group`` per (calibration, M, seed), in table order."""
        members = defaultdict(list)
        for cell in self.main_ordered:
            if cell.search in self.groups[group]:
                members[(self.label[cell.key], cell.drop, cell.seed)].append(cell)
        return members

    def group_quality(self, members: Sequence) -> tuple[list[float], list[float]]:
        """Avg perplexity and mean accuracy (points) of each cell of a group."""
        return [self.avg_ppl(c.metrics) for c in members], [self.mean_acc(c.metrics) for c in members]

    def row_name(self, cell) -> list[str]:
        """The first columns of a per-variant row: calibration, M, search (and the seed, over several)."""
        name = [self.label[cell.key], str(cell.drop), cell.search]
        if self.several_seeds:
            name.append(str(cell.seed))
        return name

    def seed_entry(self, seed: int) -> list[str]:
        """The seed column's entry of a row (none when the study ran one seed)."""
        return [str(seed)] if self.several_seeds else []

    # ------------------------------------------------------------------------------ statistics

    def budgets(self) -> list:
        """Every budget M, then ``"all"`` (pooled) when there are several."""
        drops = list(self.summary["drops"])
        return [*drops, "all"] if len(drops) > 1 else drops

    @cached_property
    def headline(self) -> dict[str, dict[str, study_stats.HeadlineComparison]]:
        """Per group and budget (and ``"all"``): mask agreement across searches vs across calibrations."""
        results = {}
        for group, searches in self.groups.items():
            results[group] = {}
            for drop in self.budgets():
                masks = {
                    (self.label[c.key], c.search, c.drop, c.seed): c.removed_blocks
                    for c in self.main
                    if c.search in searches and (drop == "all" or c.drop == drop)
                }
                results[group][str(drop)] = study_stats.headline_comparison(masks)
        return results

    @cached_property
    def movement(self) -> dict[str, dict[str, study_stats.AccuracyMovement]]:
        """Per group and budget: |Δ mean accuracy| (points) across configurations vs across searches."""
        results = {}
        for group, searches in self.groups.items():
            results[group] = {}
            for drop in self.budgets():
                accuracies = {
                    (self.label[c.key], c.search, c.drop, c.seed): self.mean_acc(c.metrics)
                    for c in self.main
                    if c.search in searches and (drop == "all" or c.drop == drop)
                }
                results[group][str(drop)] = study_stats.accuracy_movement(accuracies)
        return results

    @cached_property
    def pooled_spearman(self) -> dict[str, float]:
        """Per group: Spearman ρ between Avg-perplexity and accuracy ranks over every variant."""
        results = {}
        for group in self.groups:
            pooled_ppl, pooled_acc = [], []
            for members in self.searches_by_cell(group).values():
                ppl, acc = self.group_quality(members)
                pooled_ppl += ppl
                pooled_acc += acc
            results[group] = study_stats.perplexity_accuracy_spearman(pooled_ppl, pooled_acc)
        return results


# --------------------------------------------------------------------------------------------- sections


@dataclasses.dataclass
class Section:
    """One part of the report, rendered to Markdown and to HTML alike."""

    title: str
    text: list[str] = dataclasses.field(default_factory=list)
    header: list[str] = dataclasses.field(default_factory=list)
    rows: list[list[str]] = dataclasses.field(default_factory=list)
    images: list[str] = dataclasses.field(default_factory=list)


def window_cap(summary: dict) -> str:
    """``, at most N windows per text`` when the study capped its perplexity texts (``--eval-windows``), else
    nothing: the setup section and the reading name the cap in the same words."""
    return f", at most {summary['eval_windows']} windows per text" if summary.get("eval_windows") else ""


def setup_section(view: StudyView) -> Section:
    """The model, grid, search groups, calibration configurations, metrics and evaluation settings, the
    search-cost accounting and the protected blocks."""
    summary = view.summary
    calibrations = ", ".join(
        f"{c['objective']} on {short_data(c['data'])} ({c['samples']} samples × {c['seq_len']} tokens"
        + (f", {c['sampling']} sampling" if "sampling" in c else "")
        + ")"
        for c in summary["calibrations"]
    )
    groups = "; ".join(f"`{name}`: {', '.join(searches)}" for name, searches in view.groups.items())
    return Section(
        "Setup",
        [
            f"Model `{model_name(summary)}` (`{summary['model']}`, {view.num_blocks} blocks); budgets M = "
            f"{', '.join(map(str, summary['drops']))}; searches: {', '.join(summary['searches'])}; seeds: "
            f"{', '.join(map(str, summary['seeds']))}"
            + (
                ""
                if summary.get("data_seed") is None
                else f" (calibration draw pinned: data seed {summary['data_seed']})"
            )
            + ".",
            f"Search groups of the per-cell statistics: {groups or 'none'}.",
            f"Calibration configurations: {calibrations}.",
            f"Evaluation: suites {', '.join(summary['suites'])} (engine {summary['engine']}, "
            f"perplexity windows of {summary['eval_seq_len']} tokens capped at the model's context"
            + (f", limit {summary['eval_limit']} per task" if summary["eval_limit"] else "")
            + window_cap(summary)
            + ").",
            f"{view.metric_sentence} Rank analyses use the {view.avg_header} and the {view.mean_acc_header}.",
            timing_accounting(view),
            protection_sentence(view),
        ],
    )


def headline_section(view: StudyView) -> Section:
    """Masks across searches (calibration fixed) vs across calibrations (search fixed), per group and M."""
    verdicts = {True: "calibration changes the mask more", False: "search changes the mask more"}
    rows = [
        [
            view.group_label(group),
            drop,
            fmt(result.across_searches_same_objective),
            str(result.search_pairs),
            fmt(result.across_objectives_same_search),
            str(result.objective_pairs),
            verdicts.get(result.calibration_matters_more, "undetermined"),
        ]
        for group, by_drop in view.headline.items()
        for drop, result in by_drop.items()
    ]
    return Section(
        "Headline: does the calibration change the removed blocks more than the search does?",
        [
            "Mean Jaccard similarity of removal sets of *different searches under the same calibration* "
            "versus *different calibrations under the same search* (same M and seed). Higher similarity "
            "across searches than across calibrations means the calibration configuration matters more."
        ],
        [
            "searches",
            "M",
            "J across searches (same calibration)",
            "pairs",
            "J across calibrations (same search)",
        ]
        + ["pairs", "reading"],
        rows,
    )


def perplexity_section(view: StudyView) -> Section | None:
    """Every perplexity measured and their Avg (Table 1), dense first, with the mask of each variant."""
    if not view.ppl_tasks:
        return None

    def row(name: list[str], removed, metrics: dict) -> list[str]:
        values = [fmt(metrics.get(f"{t}/perplexity"), 2) for t in view.ppl_tasks]
        return [*name, _mask(removed, view.num_blocks), *values, fmt(view.avg_ppl(metrics), 2)]

    dense_name = ["dense", "0", "–", *([""] if view.several_seeds else [])]
    rows = [row(dense_name, [], view.dense)]
    rows += [row(view.row_name(c), c.removed_blocks, c.metrics) for c in view.main_ordered]
    return Section(
        "Perplexity",
        [f"Lower is better. ■ = removed block. The last column is the {view.avg_header}."],
        ["calibration", "M", "search", *view.seed_column, "mask", *[f"{t} ppl" for t in view.ppl_tasks]]
        + [view.avg_header],
        rows,
    )


def accuracy_sections(view: StudyView) -> list[Section]:
    """Per-task accuracy and the mean, one table per budget M (as the paper's Tables 2 and 3), dense first."""
    if not view.acc_tasks:
        return []

    def row(name: list[str], metrics: dict) -> list[str]:
        values = [fmt(accuracy_points(metrics, t, m), 2) for t, m in view.acc_metrics.items()]
        return [*name, *values, fmt(view.mean_acc(metrics), 2)]

    sections = []
    for drop in view.summary["drops"]:
        cells = [c for c in view.main_ordered if c.drop == drop]
        if not cells:
            continue
        dense_name = ["dense", "–", *([""] if view.several_seeds else [])]
        rows = [row(dense_name, view.dense)]
        rows += [row([view.label[c.key], c.search, *view.seed_entry(c.seed)], c.metrics) for c in cells]
        sections.append(
            Section(
                f"Zero-shot accuracy, M = {drop}",
                [f"Higher is better. {view.metric_sentence} Both metrics of every task are in `study.json`."],
                ["calibration", "search", *view.seed_column, *map(view.acc_header, view.acc_tasks)]
                + [view.mean_acc_header],
                rows,
            )
        )
    return sections


def _mean_and_max(mean: float, largest: float) -> str:
    return f"{fmt(mean, 2)} ({fmt(largest, 2)})"


def accuracy_movement_section(view: StudyView) -> Section | None:
    """§5.2: how far mean accuracy moves when the configuration changes vs when the search changes."""
    if not view.acc_tasks:
        return None
    rows = []
    for group, by_drop in view.movement.items():
        for drop, result in by_drop.items():
            rows.append(
                [
                    view.model_name,
                    drop,
                    view.group_label(group),
                    _mean_and_max(result.across_configurations_mean, result.across_configurations_max),
                    str(result.configuration_pairs),
                    _mean_and_max(result.across_searches_mean, result.across_searches_max),
                    str(result.search_pairs),
                ]
            )
    return Section(
        "Accuracy movement: configuration change vs search change (§5.2)",
        [
            f"Absolute difference of the {view.mean_acc_header}, in points, between two variants that differ "
            "only in the calibration configuration (same search, M, seed), and between two that differ only "
            "in the search (same configuration, M, seed): mean over the pairs (largest in brackets)."
        ],
        ["model", "M", "searches", "Δ acc, configuration changes", "pairs", "Δ acc, search changes", "pairs"],
        rows,
    )


def search_cost_section(view: StudyView) -> Section:
    """Cost (seconds, block-forwards, subsets) against loss and quality, one row per search."""
    # one row per (calibration, M, search): seeds are summarised, since under the marginal accounting a
    # later seed of a deterministic search is answered from the memo and costs nothing
    by_search = defaultdict(list)
    for cell in view.main_ordered:
        by_search[(view.label[cell.key], cell.drop, cell.search)].append(cell)
    timing_label = (
        "marginal" if (view.summary.get("timing") or "shared") == "shared" else view.summary["timing"]
    )
    rows = [
        [
            name,
            str(drop),
            search,
            fmt(_largest([c.search_seconds for c in members]), 1),
            fmt(_largest([c.block_forwards for c in members])),
            fmt(_largest([c.subset_evaluations for c in members])),
            fmt(_average([c.calibration_loss for c in members]), 4),
            fmt(_average([view.avg_ppl(c.metrics) for c in members]), 2),
            fmt(_average([view.mean_acc(c.metrics) for c in members]), 2),
        ]
        for (name, drop, search), members in by_search.items()
    ]
    return Section(
        "Search cost vs accuracy",
        [
            timing_accounting(view),
            "`subsets` (distinct removal sets a search asked for) does not depend on the accounting. "
            "Over several seeds: the largest cost, the mean loss and quality.",
            *filter(None, [machines_sentence(view)]),
            protection_sentence(view),
        ],
        ["calibration", "M", "search", f"seconds ({timing_label})", "block-forwards", "subsets"]
        + ["calibration loss"]
        + [view.avg_header, view.mean_acc_header],
        rows,
    )


def agreement_section(view: StudyView) -> Section:
    """Pairwise Jaccard (mean and range) and full overlap of the searches' masks per cell and group."""
    rows = []
    for group in view.groups:
        for (name, drop, seed), members in view.searches_by_cell(group).items():
            masks = [c.removed_blocks for c in members]
            pairwise = study_stats.pairwise_jaccard(masks)
            rows.append(
                [
                    view.group_label(group),
                    name,
                    str(drop),
                    *view.seed_entry(seed),
                    str(len(members)),
                    fmt(pairwise.mean),
                    f"[{fmt(pairwise.minimum)}, {fmt(pairwise.maximum)}]",
                    fmt(study_stats.full_overlap(masks)),
                ]
            )
    return Section(
        "Mask agreement across searches",
        [
            "Per calibration configuration and budget: Jaccard similarity |A∩B|/|A∪B| over every pair of "
            "searches (mean and [min, max]) and the full overlap |∩S|/|∪S| over all of them."
        ],
        [
            "searches",
            "calibration",
            "M",
            *view.seed_column,
            "n",
            "pairwise J mean",
            "J range",
            "full overlap",
        ],
        rows,
    )


def jaccard_aggregate_section(view: StudyView) -> Section:
    """Pairwise Jaccard pooled over cells (every calibration and seed) per budget and overall, per group."""
    rows = []
    for group in view.groups:
        cells = view.searches_by_cell(group)
        for drop in view.budgets():
            chosen = [members for (_, m, _), members in cells.items() if drop == "all" or m == drop]
            masks = [[c.removed_blocks for c in members] for members in chosen]
            pooled = study_stats.pooled_pairwise_jaccard(masks)
            overlap = _average([study_stats.full_overlap(family) for family in masks])
            rows.append(
                [view.model_name, view.group_label(group), str(drop), str(len(masks)), str(pooled.pairs)]
                + [fmt(pooled.mean), f"[{fmt(pooled.minimum)}, {fmt(pooled.maximum)}]", fmt(overlap)]
            )
    return Section(
        "Mask agreement aggregated over cells",
        [
            "Pairwise Jaccard of the searches' masks pooled over every pair within a cell (calibration, M, "
            "seed): mean and [min, max] over all those pairs, and the mean full overlap over the cells. "
            "Several models: the rows of their reports pool the same way."
        ],
        ["model", "searches", "M", "cells", "pairs", "pooled J mean", "J range", "mean full overlap"],
        rows,
    )


def variance_section(view: StudyView) -> Section:
    """Inter-method variance σ² of Avg perplexity, accuracy (points²) and calibration loss per cell."""
    rows = []
    for group in view.groups:
        for (name, drop, seed), members in view.searches_by_cell(group).items():
            ppl, acc = view.group_quality(members)
            loss = [c.calibration_loss if c.calibration_loss is not None else math.nan for c in members]
            rows.append(
                [view.group_label(group), name, str(drop), *view.seed_entry(seed), str(len(members))]
                + [
                    fmt(study_stats.inter_method_variance(ppl), 4),
                    fmt(study_stats.inter_method_variance(acc), 4),
                ]
                + [fmt(study_stats.inter_method_variance(loss), 6)]
            )
    return Section(
        "Inter-method variance σ²",
        [
            "Population variance across the searches of one calibration configuration and budget; accuracy "
            "in points² (the paper's unit), perplexity in ppl²."
        ],
        ["searches", "calibration", "M", *view.seed_column, "n", f"σ² {view.avg_header}"]
        + [f"σ² mean {view.metric_name} (points²)", "σ² calibration loss"],
        rows,
    )


def spearman_section(view: StudyView) -> Section:
    """Spearman ρ between Avg-perplexity rank and accuracy rank per cell and group, and pooled."""
    rows = []
    for group in view.groups:
        for (name, drop, seed), members in view.searches_by_cell(group).items():
            rho = study_stats.perplexity_accuracy_spearman(*view.group_quality(members))
            rows.append([view.group_label(group), name, str(drop), *view.seed_entry(seed), str(len(members))])
            rows[-1].append(fmt(rho))
    pooled = "; ".join(f"{group}: ρ = {fmt(rho)}" for group, rho in view.pooled_spearman.items())
    return Section(
        "Spearman ρ between perplexity rank and accuracy rank",
        [
            f"Ranks over the searches of one cell by {view.avg_header} (lowest = rank 1) and by "
            f"{view.mean_acc_header} (highest = rank 1): ρ = +1 means perplexity orders the variants as "
            f"accuracy does. Pooled over every variant: {pooled or 'none'}."
        ],
        ["searches", "calibration", "M", *view.seed_column, "n", "ρ"],
        rows,
        ["figures/rank_correlation.png"]
        + (["figures/rank_correlation_extensions.png"] if _has_extensions(view) else []),
    )


def seed_stability_section(view: StudyView) -> Section | None:
    """Agreement of the masks one search finds with different seeds (only over several seeds)."""
    if not view.several_seeds:
        return None
    by_cell = defaultdict(list)
    for cell in view.main_ordered:
        by_cell[(view.label[cell.key], cell.drop, cell.search)].append(cell.removed_blocks)
    return Section(
        "Seed stability",
        ["Pairwise Jaccard between the masks one search finds with different seeds."],
        ["calibration", "M", "search", "seeds", "J mean", "full overlap"],
        [
            [
                name,
                str(drop),
                search,
                str(len(masks)),
                fmt(study_stats.pairwise_jaccard(masks).mean),
                fmt(study_stats.full_overlap(masks)),
            ]
            for (name, drop, search), masks in by_cell.items()
        ],
    )


def random_prior_section(view: StudyView) -> Section | None:
    """Each random-prior control beside its single-block-prior twin (only when the control ran)."""
    controls = [cell for cell in view.ordered if cell.prior == "random"]
    if not controls:
        return None
    regular = {(view.label[c.key], c.drop, c.search, c.seed): c for c in view.main}
    rows = []
    for cell in controls:
        twin = regular.get((view.label[cell.key], cell.drop, cell.search, cell.seed))
        rows.append(
            [
                *view.row_name(cell),
                fmt(study_stats.jaccard(cell.removed_blocks, twin.removed_blocks)) if twin else "–",
                fmt(twin.calibration_loss, 4) if twin else "–",
                fmt(cell.calibration_loss, 4),
                fmt(view.avg_ppl(cell.metrics), 2),
                fmt(view.mean_acc(cell.metrics), 2),
            ]
        )
    return Section(
        "Random-prior control",
        [
            "Prior-guided searches re-run with a seeded random ranking instead of the single-block scores: "
            "how much of their mask and loss comes from the shared prior."
        ],
        ["calibration", "M", "search", *view.seed_column, "J vs single-block prior", "loss (prior)"]
        + ["loss (random prior)", view.avg_header, view.mean_acc_header],
        rows,
    )


def _has_extensions(view: StudyView) -> bool:
    """Whether some cell is an extension (another budget than the paper's, or another objective), drawn in
    the ``*_extensions.png`` figures apart from the paper's."""
    from pruning.study.paper import PAPER, paper_budgets

    budgets = paper_budgets(view.num_blocks)
    return any(c.drop not in budgets or c.objective not in PAPER.objectives for c in view.main)


def figures_section(view: StudyView) -> Section:
    """The heatmaps (one per budget) and the trade-off figures (the paper's; the extensions' apart)."""
    drops = view.summary["drops"]
    extensions = ["figures/tradeoff_extensions.png"] if _has_extensions(view) else []
    return Section(
        "Figures",
        [],
        images=[*[f"figures/heatmap_m{drop}.png" for drop in drops], "figures/tradeoff.png", *extensions],
    )


SECTIONS: tuple[Callable[[StudyView], Section | list[Section] | None], ...] = (
    setup_section,
    headline_section,
    perplexity_section,
    accuracy_sections,
    accuracy_movement_section,
    search_cost_section,
    agreement_section,
    jaccard_aggregate_section,
    variance_section,
    spearman_section,
    seed_stability_section,
    random_prior_section,
    figures_section,
)
"""The report's sections in order; a function returns one section, several, or None to leave it out."""


def build_sections(summary: dict, cells: Sequence, dense: dict) -> tuple[list[Section], dict]:
    """All report sections and the numbers behind them (for ``study.json``).

    Args:
        summary: the study's setup (:func:`pruning.study.plan.plan_summary`).
        cells: finished cells, metrics filled in.
        dense: the dense model's metrics.

    Returns:
        The sections in report order, and a JSON-ready dict: the headline (of the ``study`` group, else
        ``all``) and per group, the pooled Spearman ρ and accuracy movement per group, the perplexities in
        Avg and the metric of each accuracy task.
    """
    view = StudyView(summary, cells, dense)
    sections: list[Section] = []
    for build in SECTIONS:
        made = build(view)
        sections += made if isinstance(made, list) else [made] if made is not None else []
    headline = {
        group: {drop: dataclasses.asdict(result) for drop, result in by_drop.items()}
        for group, by_drop in view.headline.items()
    }
    return sections, {
        "headline": next(iter(headline.values()), {}),
        "headline_by_group": headline,
        "search_groups": {group: list(searches) for group, searches in view.groups.items()},
        "pooled_spearman": view.pooled_spearman,
        "accuracy_movement": {
            group: {drop: dataclasses.asdict(result) for drop, result in by_drop.items()}
            for group, by_drop in view.movement.items()
        },
        "average_perplexity_tasks": view.avg_tasks,
        "accuracy_metrics": view.acc_metrics,
    }
