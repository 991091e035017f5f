"""The study report's sections: one function per table, all reading one :class:`StudyView` of the cells.

:func:`build_sections` runs every function of :data:`SECTIONS` in order and returns the sections that apply
(the seed-stability and random-prior tables only when the study ran them) with the headline numbers that
``study.json`` keeps. :mod:`pruning.study.report` renders the sections; :mod:`pruning.study.figures` draws
from the same view.

Conventions: the primary perplexity is the first of ``wikitext2``, ``demo_text``, ``c4``, ``lambada`` that
was measured; the accuracy is the mean ``acc`` over the accuracy tasks measured. The statistics come from
:mod:`pruning.study.statistics`.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from functools import cached_property
from pathlib import Path

from pruning.study import statistics as study_stats

PRIMARY_PERPLEXITY = ("wikitext2", "demo_text", "c4", "lambada")


# ------------------------------------------------------------------------------------------ cell helpers


def short_data(spec: str) -> str:
    """``demo:text@/long/path`` -> ``demo:text``; paths shortened to their file name."""
    name = spec.split("@", 1)[0]
    if name.startswith(("text:", "mc:")):
        prefix, _, path = name.partition(":")
        return f"{prefix}:{Path(path).name}"
    return name


def calibration_label(cell, multiple_data: bool) -> str:
    """The objective, plus the data source when some objective runs on several."""
    return f"{cell.objective} on {short_data(cell.data)}" if multiple_data else cell.objective


def perplexity_tasks(metrics_list: Sequence[dict]) -> list[str]:
    """Perplexity tasks measured anywhere, primary first."""
    tasks = {key.split("/")[0] for metrics in metrics_list for key in metrics if key.endswith("/perplexity")}
    return [t for t in PRIMARY_PERPLEXITY if t in tasks] + sorted(tasks - set(PRIMARY_PERPLEXITY))


def accuracy_tasks(metrics_list: Sequence[dict]) -> list[str]:
    """Tasks with an ``acc`` measured anywhere, sorted."""
    return sorted({key.split("/")[0] for metrics in metrics_list for key in metrics if key.endswith("/acc")})


def mean_accuracy(metrics: dict, tasks: Sequence[str]) -> float:
    """Mean ``acc`` over ``tasks`` (NaN when one is missing)."""
    values = [metrics.get(f"{task}/acc") for task in tasks]
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
        summary: the study's setup (:func:`pruning.study.grid.plan_summary`).
        cells: finished cells (:class:`pruning.study.grid.CellResult`), metrics filled in.
        dense: the dense model's metrics, ``"task/metric" -> value``.
    """

    def __init__(self, summary: dict, cells: Sequence, dense: dict):
        self.summary, self.cells, self.dense = summary, cells, dense
        self.num_blocks: int = summary["num_blocks"]
        objectives_data = defaultdict(set)
        for cell in cells:
            objectives_data[cell.objective].add(cell.data)
        self.multiple_data = any(len(data) > 1 for data in objectives_data.values())
        self.label = {cell.key: calibration_label(cell, self.multiple_data) for cell in cells}
        self.main = [cell for cell in cells if cell.prior == "single_block"]
        """Cells searched under the single-block prior (the study proper), in the given order."""
        self.all_metrics = [dense] + [cell.metrics for cell in cells]
        self.ppl_tasks = perplexity_tasks(self.all_metrics)
        self.acc_tasks = accuracy_tasks(self.all_metrics)
        self.primary = self.ppl_tasks[0] if self.ppl_tasks else None
        """The primary perplexity task (None when no perplexity was measured)."""
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

    def primary_ppl(self, metrics: dict) -> float:
        """The primary perplexity in ``metrics`` (NaN when missing)."""
        return metrics.get(f"{self.primary}/perplexity", math.nan) if self.primary else math.nan

    def row_name(self, cell) -> list[str]:
        """The first columns of a per-variant row: calibration, M, search (and the seed, over several)."""
        name = [self.label[cell.key], str(cell.drop), cell.search]
        if self.several_seeds:
            name.append(str(cell.seed))
        return name

    def seed_entry(self, seed: int) -> list[str]:
        """The seed column's entry of a row (none when the study ran one seed)."""
        return [str(seed)] if self.several_seeds else []

    @cached_property
    def headline(self) -> dict[str, study_stats.HeadlineComparison]:
        """Per budget (and ``"all"``): mask agreement across searches vs across calibrations."""
        results = {}
        for drop in [*self.summary["drops"], "all"]:
            masks = {
                (self.label[c.key], c.search, c.drop, c.seed): c.removed_blocks
                for c in self.main
                if drop == "all" or c.drop == drop
            }
            results[str(drop)] = study_stats.headline_comparison(masks)
        return results

    @cached_property
    def searches_by_cell(self) -> dict[tuple, list]:
        """The searches of one (calibration, M, seed), in table order."""
        groups = defaultdict(list)
        for cell in self.main_ordered:
            groups[(self.label[cell.key], cell.drop, cell.seed)].append(cell)
        return groups

    def group_quality(self, members: Sequence) -> tuple[list[float], list[float]]:
        """Primary perplexity and mean accuracy of each cell of a group."""
        ppl = [self.primary_ppl(c.metrics) for c in members]
        acc = [mean_accuracy(c.metrics, self.acc_tasks) for c in members]
        return ppl, acc

    @cached_property
    def pooled_spearman(self) -> float:
        """Spearman ρ between perplexity and accuracy ranks over every variant of the study proper."""
        pooled_ppl, pooled_acc = [], []
        for members in self.searches_by_cell.values():
            ppl, acc = self.group_quality(members)
            pooled_ppl += ppl
            pooled_acc += acc
        return study_stats.perplexity_accuracy_spearman(pooled_ppl, pooled_acc)


# --------------------------------------------------------------------------------------------- sections


@dataclasses.dataclass
class Section:
    """One part of the report, rendered to Markdown and to HTML alike."""

    title: str
    text: list[str] = dataclasses.field(default_factory=list)
    header: list[str] = dataclasses.field(default_factory=list)
    rows: list[list[str]] = dataclasses.field(default_factory=list)
    images: list[str] = dataclasses.field(default_factory=list)


def setup_section(view: StudyView) -> Section:
    """The model, grid, calibration configurations and evaluation settings."""
    summary = view.summary
    calibrations = ", ".join(
        f"{c['objective']} on {short_data(c['data'])} ({c['samples']} samples × {c['seq_len']} tokens)"
        for c in summary["calibrations"]
    )
    return Section(
        "Setup",
        [
            f"Model `{summary['model']}` ({view.num_blocks} blocks); budgets M = "
            f"{', '.join(map(str, summary['drops']))}; "
            f"searches: {', '.join(summary['searches'])}; seeds: "
            f"{', '.join(map(str, summary['seeds']))}.",
            f"Calibration configurations: {calibrations}.",
            f"Evaluation: suites {', '.join(summary['suites'])} (engine {summary['engine']}, "
            f"perplexity windows of {summary['eval_seq_len']} tokens capped at the model's context"
            + (f", limit {summary['eval_limit']} per task" if summary["eval_limit"] else "")
            + ").",
            f"Primary perplexity: `{view.primary}`; accuracy: mean `acc` over "
            f"{', '.join(view.acc_tasks) or 'no task'}.",
        ],
    )


def headline_section(view: StudyView) -> Section:
    """Masks across searches (calibration fixed) vs across calibrations (search fixed), per budget."""
    rows = []
    for drop, result in view.headline.items():
        verdict = {
            True: "calibration changes the mask more",
            False: "search changes the mask more",
            None: "undetermined",
        }[result.calibration_matters_more]
        rows.append(
            [
                drop,
                fmt(result.across_searches_same_objective),
                str(result.search_pairs),
                fmt(result.across_objectives_same_search),
                str(result.objective_pairs),
                verdict,
            ]
        )
    return Section(
        "Headline: does the calibration change the removed blocks more than the search does?",
        [
            "Mean Jaccard similarity of removal sets of *different searches under the same "
            "calibration* versus "
            "*different calibrations under the same search* (same M and seed). Higher similarity "
            "across searches "
            "than across calibrations means the calibration configuration matters more."
        ],
        [
            "M",
            "J across searches (same calibration)",
            "pairs",
            "J across calibrations (same search)",
            "pairs",
            "reading",
        ],
        rows,
    )


def perplexity_section(view: StudyView) -> Section | None:
    """Every perplexity measured, dense first, with the mask of each variant."""
    if not view.ppl_tasks:
        return None
    rows = [
        [
            "dense",
            "0",
            "–",
            *([""] if view.several_seeds else []),
            _mask([], view.num_blocks),
            *[fmt(view.dense.get(f"{t}/perplexity"), 2) for t in view.ppl_tasks],
        ]
    ]
    rows += [
        [
            *view.row_name(c),
            _mask(c.removed_blocks, view.num_blocks),
            *[fmt(c.metrics.get(f"{t}/perplexity"), 2) for t in view.ppl_tasks],
        ]
        for c in view.main_ordered
    ]
    return Section(
        "Perplexity",
        ["Lower is better. ■ = removed block."],
        ["calibration", "M", "search", *view.seed_column, "mask", *view.ppl_tasks],
        rows,
    )


def accuracy_section(view: StudyView) -> Section | None:
    """``acc`` of every accuracy task and their mean, dense first."""
    if not view.acc_tasks:
        return None
    acc_tasks = view.acc_tasks
    rows = [
        [
            "dense",
            "0",
            "–",
            *([""] if view.several_seeds else []),
            *[fmt(view.dense.get(f"{t}/acc")) for t in acc_tasks],
            fmt(mean_accuracy(view.dense, acc_tasks)),
        ]
    ]
    rows += [
        [
            *view.row_name(c),
            *[fmt(c.metrics.get(f"{t}/acc")) for t in acc_tasks],
            fmt(mean_accuracy(c.metrics, acc_tasks)),
        ]
        for c in view.main_ordered
    ]
    norm_tasks = sorted({k.split("/")[0] for m in view.all_metrics for k in m if k.endswith("/acc_norm")})
    return Section(
        "Zero-shot accuracy",
        [
            "`acc` per task (higher is better); `acc_norm` "
            + (f"(measured for {', '.join(norm_tasks)}) " if norm_tasks else "")
            + "is in `study.json`."
        ],
        ["calibration", "M", "search", *view.seed_column, *acc_tasks, "mean"],
        rows,
    )


def search_cost_section(view: StudyView) -> Section:
    """Cost (seconds, block-forwards, subsets) against loss and quality, one row per search."""
    # one row per (calibration, M, search): seeds are summarised, since a later seed of a deterministic
    # search is answered from the memo and costs nothing
    by_search = defaultdict(list)
    for cell in view.main_ordered:
        by_search[(view.label[cell.key], cell.drop, cell.search)].append(cell)
    rows = [
        [
            name,
            str(drop),
            search,
            fmt(_largest([c.search_seconds for c in members]), 1),
            fmt(_largest([c.block_forwards for c in members])),
            fmt(_largest([c.subset_evaluations for c in members])),
            fmt(_average([c.calibration_loss for c in members]), 4),
            fmt(_average([view.primary_ppl(c.metrics) for c in members]), 2),
            fmt(_average([mean_accuracy(c.metrics, view.acc_tasks) for c in members])),
        ]
        for (name, drop, search), members in by_search.items()
    ]
    return Section(
        "Search cost vs accuracy",
        [
            "Searches of one calibration configuration share one memoised evaluator (the `prune` "
            "pipeline, memo kept across runs), so seconds and block-forwards of a search exclude subsets "
            "an earlier search already scored; `subsets` (distinct removal sets a search asked for) does "
            "not depend on that sharing. Over several seeds: the largest cost, the mean loss and quality."
        ],
        [
            "calibration",
            "M",
            "search",
            "seconds",
            "block-forwards",
            "subsets",
            "calibration loss",
            f"{view.primary} ppl",
            "mean acc",
        ],
        rows,
    )


def agreement_section(view: StudyView) -> Section:
    """Pairwise Jaccard (mean and range) and full overlap of the searches' masks per cell."""
    rows = []
    for (name, drop, seed), members in view.searches_by_cell.items():
        masks = [c.removed_blocks for c in members]
        pairwise = study_stats.pairwise_jaccard(masks)
        rows.append(
            [
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
            "Per calibration configuration and budget: Jaccard similarity |A∩B|/|A∪B| over every pair "
            "of searches "
            "(mean and [min, max]) and the full overlap |∩S|/|∪S| over all of them."
        ],
        ["calibration", "M", *view.seed_column, "searches", "pairwise J mean", "J range", "full overlap"],
        rows,
    )


def variance_section(view: StudyView) -> Section:
    """Inter-method variance σ² of perplexity, accuracy and calibration loss per cell."""
    rows = []
    for (name, drop, seed), members in view.searches_by_cell.items():
        ppl, acc = view.group_quality(members)
        loss = [c.calibration_loss if c.calibration_loss is not None else math.nan for c in members]
        rows.append(
            [
                name,
                str(drop),
                *view.seed_entry(seed),
                fmt(study_stats.inter_method_variance(ppl), 4),
                fmt(study_stats.inter_method_variance(acc), 6),
                fmt(study_stats.inter_method_variance(loss), 6),
            ]
        )
    return Section(
        "Inter-method variance σ²",
        ["Population variance across the searches of one calibration configuration and budget."],
        [
            "calibration",
            "M",
            *view.seed_column,
            f"σ² {view.primary} ppl",
            "σ² mean acc",
            "σ² calibration loss",
        ],
        rows,
    )


def spearman_section(view: StudyView) -> Section:
    """Spearman ρ between perplexity rank and accuracy rank per cell, and pooled."""
    rows = []
    for (name, drop, seed), members in view.searches_by_cell.items():
        rho = study_stats.perplexity_accuracy_spearman(*view.group_quality(members))
        rows.append([name, str(drop), *view.seed_entry(seed), str(len(members)), fmt(rho)])
    return Section(
        "Spearman ρ between perplexity rank and accuracy rank",
        [
            "Ranks over the searches of one cell (lowest perplexity = rank 1, highest accuracy = rank "
            "1): ρ = +1 "
            f"means perplexity orders the variants as accuracy does. Pooled over every variant: ρ = "
            f"{fmt(view.pooled_spearman)}."
        ],
        ["calibration", "M", *view.seed_column, "variants", "ρ"],
        rows,
        ["figures/rank_correlation.png"],
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
                fmt(view.primary_ppl(cell.metrics), 2),
                fmt(mean_accuracy(cell.metrics, view.acc_tasks)),
            ]
        )
    return Section(
        "Random-prior control",
        [
            "Prior-guided searches re-run with a seeded random ranking instead of the single-block "
            "scores: "
            "how much of their mask and loss comes from the shared prior."
        ],
        [
            "calibration",
            "M",
            "search",
            *view.seed_column,
            "J vs single-block prior",
            "loss (prior)",
            "loss (random prior)",
            f"{view.primary} ppl",
            "mean acc",
        ],
        rows,
    )


def figures_section(view: StudyView) -> Section:
    """The heatmaps (one per budget) and the trade-off figure."""
    drops = view.summary["drops"]
    return Section(
        "Figures", [], images=[*[f"figures/heatmap_m{drop}.png" for drop in drops], "figures/tradeoff.png"]
    )


SECTIONS: tuple[Callable[[StudyView], Section | None], ...] = (
    setup_section,
    headline_section,
    perplexity_section,
    accuracy_section,
    search_cost_section,
    agreement_section,
    variance_section,
    spearman_section,
    seed_stability_section,
    random_prior_section,
    figures_section,
)
"""The report's sections in order; a function returning None leaves its section out."""


def build_sections(summary: dict, cells: Sequence, dense: dict) -> tuple[list[Section], dict]:
    """All report sections and the numbers behind the headline (for ``study.json``).

    Args:
        summary: the study's setup (:func:`pruning.study.grid.plan_summary`).
        cells: finished cells, metrics filled in.
        dense: the dense model's metrics.

    Returns:
        The sections in report order, and the headline, pooled Spearman ρ, primary perplexity and
        accuracy tasks as a JSON-ready dict.
    """
    view = StudyView(summary, cells, dense)
    sections = [section for build in SECTIONS if (section := build(view)) is not None]
    return sections, {
        "headline": {drop: dataclasses.asdict(result) for drop, result in view.headline.items()},
        "pooled_spearman": view.pooled_spearman,
        "primary_perplexity": view.primary,
        "accuracy_tasks": view.acc_tasks,
    }
