"""The study report's figures (PNG): one function per figure, all reading one :class:`StudyView`.

:func:`draw_figures` runs every function of :data:`FIGURES` in order into ``figures/``:

* ``heatmap_m{M}.png`` — removed blocks per (calibration, search) for each budget M;
* ``tradeoff.png`` — Avg perplexity (WikiText-2, C4, LAMBADA; what exists for demo/offline studies) vs mean
  accuracy (the reported metric per task, points) of every variant;
* ``rank_correlation.png`` — Avg-perplexity rank vs accuracy rank per (calibration, M), the paper's seven, one
  point per search and seed (ranks within the seed), ρ per seed in the title as the reading counts it;

The trade-off and rank figures show the paper's budgets and objectives only
(:func:`pruning.study.reading_basis.paper_budgets`, ``PAPER.objectives``); the extensions (another budget, an
objective the paper did not run, as task_ce) go to ``tradeoff_extensions.png`` and
``rank_correlation_extensions.png``, and a heatmap of another budget is titled an extension.
* ``similarity.png`` — when the study ran ``lorp``: per calibration, the block-input similarity matrix S
  LoRP saw, its clusters boxed along the diagonal (as LoRP's figures draw them), RLS and K in the title.

matplotlib is imported inside the functions (with the ``Agg`` backend), so importing the report costs nothing.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path

from pruning.study import statistics as study_stats
from pruning.study.paper import PAPER, paper_budgets
from pruning.study.paths import resolved_path
from pruning.study.tables import StudyView, calibration_label, fmt


def _save(figure, path: Path) -> Path:
    import matplotlib.pyplot as plt

    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


def _calibration_colors(view: StudyView) -> tuple[list[str], dict]:
    """The calibration labels of the study proper, sorted, and one tab10 colour each."""
    import matplotlib.pyplot as plt

    labels = sorted({calibration_label(c, view.multiple_data) for c in view.main})
    return labels, {name: plt.cm.tab10(i % 10) for i, name in enumerate(labels)}


def _budget_title(view: StudyView, drop: int) -> str:
    """``M = 8 (≈ the paper's 9)`` or ``M = 10 (extension)``."""
    paper = paper_budgets(view.num_blocks).get(drop)
    return f"M = {drop} (≈ the paper's {paper})" if paper else f"M = {drop} (extension)"


def _is_paper(view: StudyView, cell) -> bool:
    """Whether ``cell`` is compared with the paper: one of its budgets and objectives."""
    return cell.drop in paper_budgets(view.num_blocks) and cell.objective in PAPER.objectives


def _search_markers(view: StudyView) -> dict[str, str]:
    """One marker per search, in the order the study lists them."""
    return {name: "osD^v<>pP*X"[i % 11] for i, name in enumerate(view.summary["searches"])}


def _draw_heatmap(directory: Path, view: StudyView, drop: int) -> Path | None:
    """Share of seeds removing each block, per (calibration, search), at budget ``drop``."""
    import matplotlib.pyplot as plt
    import numpy as np

    num_blocks = view.num_blocks
    rows = defaultdict(lambda: np.zeros(num_blocks))
    counts = defaultdict(int)
    for cell in view.main:
        if cell.drop == drop:
            key = (calibration_label(cell, view.multiple_data), cell.search)
            for block in cell.removed_blocks:
                rows[key][block] += 1
            counts[key] += 1
    if not rows:
        return None
    keys = sorted(rows, key=lambda k: (k[0], view.search_position(k[1])))
    grid = np.stack([rows[k] / counts[k] for k in keys])
    figure, axes = plt.subplots(figsize=(max(6, 0.4 * num_blocks + 3), 0.35 * len(keys) + 1.5))
    axes.imshow(grid, cmap="Reds", vmin=0, vmax=1, aspect="auto")
    axes.set_yticks(range(len(keys)), [f"{k[0]} · {k[1]}" for k in keys], fontsize=8)
    axes.set_xticks(range(num_blocks), [str(i) for i in range(num_blocks)], fontsize=8)
    axes.set_xlabel("block index")
    for boundary in [i - 0.5 for i in range(1, len(keys)) if keys[i][0] != keys[i - 1][0]]:
        axes.axhline(boundary, color="black", linewidth=1)
    seeds = len(view.summary["seeds"])
    axes.set_title(
        f"Removed blocks, {_budget_title(view, drop)}" + (f" (share of {seeds} seeds)" if seeds > 1 else "")
    )
    figure.tight_layout()
    return _save(figure, directory / f"heatmap_m{drop}.png")


def heatmap_figures(directory: Path, view: StudyView) -> list[Path]:
    """``heatmap_m{M}.png`` for every budget that has cells."""
    drawn = [_draw_heatmap(directory, view, drop) for drop in view.summary["drops"]]
    return [path for path in drawn if path is not None]


def _tradeoff_panel(axes, view: StudyView, drop: int, cells: list, colors: dict, markers: dict) -> None:
    """Avg perplexity vs mean accuracy of ``cells`` at budget ``drop``, with the dense model."""
    for cell in cells:
        if cell.drop != drop:
            continue
        axes.scatter(
            view.avg_ppl(cell.metrics),
            view.mean_acc(cell.metrics),
            color=colors[calibration_label(cell, view.multiple_data)],
            marker=markers.get(cell.search, "o"),
            s=45,
            alpha=0.85,
        )
    if not math.isnan(view.avg_ppl(view.dense)):
        axes.scatter(
            view.avg_ppl(view.dense),
            view.mean_acc(view.dense),
            color="black",
            marker="*",
            s=150,
            label="dense",
        )
    xs = [x for x in (view.avg_ppl(c.metrics) for c in cells if c.drop == drop) if not math.isnan(x)]
    if xs and max(xs) / min(xs) > 3:  # log scale only pays off over a wide range
        axes.set_xscale("log")
    axes.set_xlabel(view.avg_header)
    axes.set_ylabel(view.mean_acc_header)
    axes.set_title(_budget_title(view, drop))
    axes.grid(alpha=0.3)


def _tradeoff(path: Path, view: StudyView, cells: list, title: str) -> Path | None:
    """One perplexity-vs-accuracy panel per budget of ``cells``, one legend; None without cells."""
    import matplotlib.pyplot as plt

    drops = sorted({c.drop for c in cells})
    if not drops:
        return None
    _, colors = _calibration_colors(view)
    labels = sorted({calibration_label(c, view.multiple_data) for c in cells})
    markers = _search_markers(view)
    figure, axes_list = plt.subplots(1, len(drops), figsize=(5.5 * len(drops), 4.5), squeeze=False)
    for axes, drop in zip(axes_list[0], drops, strict=True):
        _tradeoff_panel(axes, view, drop, cells, colors, markers)
    handles = [plt.Line2D([], [], color=colors[n], marker="o", linestyle="", label=n) for n in labels]
    handles += [plt.Line2D([], [], color="gray", marker=m, linestyle="", label=s) for s, m in markers.items()]
    handles.append(plt.Line2D([], [], color="black", marker="*", linestyle="", markersize=10, label="dense"))
    figure.legend(handles=handles, loc="center right", fontsize=8)
    figure.suptitle(title)
    figure.tight_layout(rect=(0, 0, 0.82, 1))
    return _save(figure, path)


def tradeoff_figure(directory: Path, view: StudyView) -> list[Path]:
    """``tradeoff.png``: the paper's budgets and objectives; ``tradeoff_extensions.png``: the rest."""
    paper = [c for c in view.main if _is_paper(view, c)]
    others = [c for c in view.main if not _is_paper(view, c)]
    drawn = [
        _tradeoff(
            directory / "tradeoff.png",
            view,
            paper,
            "Perplexity vs accuracy, the paper's budgets and objectives",
        ),
        _tradeoff(directory / "tradeoff_extensions.png", view, others, "Perplexity vs accuracy, extensions"),
    ]
    return [path for path in drawn if path is not None]


def _rank_panel(axes, view: StudyView, name: str, drop: int, color, markers: dict) -> None:
    """Avg-perplexity rank vs accuracy rank of the searches of one (calibration, M), ranks within each seed,
    titled with ρ per seed (the reading's per-cell statistic), not ρ pooled over seeds."""
    searches = next(iter(view.groups.values()), ())  # the paper's seven when they ran
    members = [
        c
        for c in view.main
        if calibration_label(c, view.multiple_data) == name and c.drop == drop and c.search in searches
    ]
    rhos = []
    for seed in sorted({c.seed for c in members}):
        cells = [c for c in members if c.seed == seed]
        ppl, acc = view.group_quality(cells)
        usable = [
            (p, a, c) for p, a, c in zip(ppl, acc, cells, strict=True) if not (math.isnan(p) or math.isnan(a))
        ]
        if usable:
            ppl_rank = study_stats.rank([p for p, _, _ in usable])
            acc_rank = study_stats.rank([a for _, a, _ in usable], descending=True)
            for x, y, (_, _, cell) in zip(ppl_rank, acc_rank, usable, strict=True):
                axes.scatter(x, y, marker=markers.get(cell.search, "o"), color=color, s=45, alpha=0.7)
        rhos.append(fmt(study_stats.perplexity_accuracy_spearman(ppl, acc), 2))
    top = len(searches) + 0.5
    axes.plot([0.5, top], [0.5, top], color="gray", linewidth=0.8, linestyle="--")
    axes.set_title(f"{name}, {_budget_title(view, drop)}\nρ per seed: {', '.join(rhos)}", fontsize=9)
    axes.set_xlabel("Avg perplexity rank (within a seed)")
    axes.set_ylabel("accuracy rank")


def _rank_figure(path: Path, view: StudyView, cells: list) -> Path | None:
    """One rank-vs-rank panel per (calibration, M) of ``cells``, four to a row; None without cells."""
    import matplotlib.pyplot as plt

    _, colors = _calibration_colors(view)
    markers = _search_markers(view)
    panels = sorted({(calibration_label(c, view.multiple_data), c.drop) for c in cells})
    if not panels:
        return None
    columns = min(4, len(panels))
    rows_count = math.ceil(len(panels) / columns)
    figure, axes_grid = plt.subplots(
        rows_count, columns, figsize=(4 * columns, 3.8 * rows_count), squeeze=False
    )
    for axes in axes_grid.flat[len(panels) :]:
        axes.axis("off")
    for axes, (name, drop) in zip(axes_grid.flat, panels, strict=False):
        _rank_panel(axes, view, name, drop, colors[name], markers)
    figure.tight_layout()
    return _save(figure, path)


def rank_correlation_figure(directory: Path, view: StudyView) -> list[Path]:
    """``rank_correlation.png``: the paper's budgets and objectives; ``rank_correlation_extensions.png``."""
    paper = [c for c in view.main if _is_paper(view, c)]
    others = [c for c in view.main if not _is_paper(view, c)]
    drawn = [
        _rank_figure(directory / "rank_correlation.png", view, paper),
        _rank_figure(directory / "rank_correlation_extensions.png", view, others),
    ]
    return [path for path in drawn if path is not None]


def _lorp_records(view: StudyView) -> dict[str, dict]:
    """Per calibration, the options LoRP recorded in ``pruning.json`` (lowest M and seed first)."""
    records: dict[str, dict] = {}
    cells = sorted(
        (c for c in view.main if c.search == "lorp" and c.checkpoint), key=lambda c: (c.drop, c.seed)
    )
    for cell in cells:
        label = calibration_label(cell, view.multiple_data)
        path = Path(resolved_path(cell.checkpoint)) / "pruning.json"
        if label in records or not path.is_file():
            continue
        options = (json.loads(path.read_text()).get("scores") or {}).get("search_options") or {}
        if options.get("block_input_similarity") and options.get("cluster_labels"):
            records[label] = options
    return records


def _similarity_panel(axes, name: str, options: dict) -> None:
    """S as a heatmap, each run of consecutive blocks of one cluster boxed on the diagonal."""
    from matplotlib.patches import Rectangle

    similarity, labels = options["block_input_similarity"], options["cluster_labels"]
    image = axes.imshow(similarity, cmap="viridis", vmin=min(0.0, min(map(min, similarity))), vmax=1)
    start = 0
    for index in range(1, len(labels) + 1):
        if index == len(labels) or labels[index] != labels[start]:
            width = index - start
            axes.add_patch(
                Rectangle((start - 0.5, start - 0.5), width, width, fill=False, color="red", lw=1.5)
            )
            start = index
    axes.set_title(f"{name}: RLS {fmt(options.get('rls'))}, K = {options['cluster_count']}")
    axes.set_xlabel("block (input)")
    axes.set_ylabel("block (input)")
    axes.figure.colorbar(image, ax=axes, shrink=0.8)


def similarity_figure(directory: Path, view: StudyView) -> list[Path]:
    """``similarity.png``: LoRP's S per calibration with its clusters (nothing when lorp did not run)."""
    import matplotlib.pyplot as plt

    records = _lorp_records(view)
    if not records:
        return []
    figure, axes_grid = plt.subplots(1, len(records), figsize=(5 * len(records), 4.4), squeeze=False)
    for axes, (name, options) in zip(axes_grid.flat, sorted(records.items()), strict=True):
        _similarity_panel(axes, name, options)
    figure.tight_layout()
    return [_save(figure, directory / "similarity.png")]


FIGURES: tuple[Callable[[Path, StudyView], list[Path]], ...] = (
    heatmap_figures,
    tradeoff_figure,
    rank_correlation_figure,
    similarity_figure,
)
"""The report's figures in drawing order; each writes its PNG files and returns their paths."""


def draw_figures(directory: Path, summary: dict, cells: Sequence, dense: dict) -> list[Path]:
    """Write the PNG figures into ``directory``.

    Args:
        directory: where the figures go (created if missing).
        summary: the study's setup (:func:`pruning.study.plan.plan_summary`).
        cells: finished cells, metrics filled in.
        dense: the dense model's metrics.

    Returns:
        The paths written.
    """
    import matplotlib

    matplotlib.use("Agg")
    directory.mkdir(parents=True, exist_ok=True)
    view = StudyView(summary, cells, dense)
    return [path for draw in FIGURES for path in draw(directory, view)]
