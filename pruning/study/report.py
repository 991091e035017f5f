"""The study report: tables (Markdown and HTML), figures (PNG) and the raw numbers (JSON) of a study grid.

:func:`write_report` takes the finished cells of :mod:`pruning.study.grid` and writes into one directory:

* ``README.md`` and ``report.html`` — setup, the headline comparison (mask agreement across searches under
  one calibration vs across calibrations under one search), perplexity table, zero-shot table, search cost vs
  accuracy, pairwise Jaccard mean/range and full overlap, inter-method variance σ², Spearman ρ between the
  perplexity rank and the accuracy rank, and, when run, the seed-stability and random-prior controls;
* ``figures/heatmap_m{M}.png`` — removed blocks per (calibration, search) for each budget M;
* ``figures/tradeoff.png`` — perplexity vs mean accuracy of every variant;
* ``figures/rank_correlation.png`` — perplexity rank vs accuracy rank per (calibration, M);
* ``study.json`` — every cell with its mask, losses, costs and metrics.

Conventions: the primary perplexity is the first of ``wikitext2``, ``demo_text``, ``c4``, ``lambada`` that
was measured; the accuracy is the mean ``acc`` over the accuracy tasks measured. The statistics come from
:mod:`pruning.study.statistics`.
"""

from __future__ import annotations

import dataclasses
import html
import json
import math
from collections import defaultdict
from collections.abc import Sequence
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


def _fmt(value, digits: int = 3) -> str:
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


# --------------------------------------------------------------------------------------------- sections


@dataclasses.dataclass
class Section:
    """One part of the report, rendered to Markdown and to HTML alike."""

    title: str
    text: list[str] = dataclasses.field(default_factory=list)
    header: list[str] = dataclasses.field(default_factory=list)
    rows: list[list[str]] = dataclasses.field(default_factory=list)
    images: list[str] = dataclasses.field(default_factory=list)


def build_sections(summary: dict, cells: Sequence, dense: dict) -> tuple[list[Section], dict]:
    """All report sections and the numbers behind the headline (for ``study.json``)."""
    num_blocks = summary["num_blocks"]
    objectives_data = defaultdict(set)
    for cell in cells:
        objectives_data[cell.objective].add(cell.data)
    multiple_data = any(len(data) > 1 for data in objectives_data.values())
    label = {cell.key: calibration_label(cell, multiple_data) for cell in cells}
    main = [cell for cell in cells if cell.prior == "single_block"]
    all_metrics = [dense] + [cell.metrics for cell in cells]
    ppl_tasks, acc_tasks = perplexity_tasks(all_metrics), accuracy_tasks(all_metrics)
    primary = ppl_tasks[0] if ppl_tasks else None
    several_seeds = len(summary["seeds"]) > 1

    def primary_ppl(metrics: dict) -> float:
        return metrics.get(f"{primary}/perplexity", math.nan) if primary else math.nan

    def row_name(cell) -> list[str]:
        name = [label[cell.key], str(cell.drop), cell.search]
        if several_seeds:
            name.append(str(cell.seed))
        return name

    sections: list[Section] = []
    calibrations = ", ".join(
        f"{c['objective']} on {short_data(c['data'])} ({c['samples']} samples × {c['seq_len']} tokens)"
        for c in summary["calibrations"]
    )
    sections.append(
        Section(
            "Setup",
            [
                f"Model `{summary['model']}` ({num_blocks} blocks); budgets M = "
                f"{', '.join(map(str, summary['drops']))}; "
                f"searches: {', '.join(summary['searches'])}; seeds: "
                f"{', '.join(map(str, summary['seeds']))}.",
                f"Calibration configurations: {calibrations}.",
                f"Evaluation: suites {', '.join(summary['suites'])} (engine {summary['engine']}, "
                f"perplexity windows of {summary['eval_seq_len']} tokens capped at the model's context"
                + (f", limit {summary['eval_limit']} per task" if summary["eval_limit"] else "")
                + ").",
                f"Primary perplexity: `{primary}`; accuracy: mean `acc` over "
                f"{', '.join(acc_tasks) or 'no task'}.",
            ],
        )
    )

    # headline: masks across searches (calibration fixed) vs across calibrations (search fixed)
    headline_rows, headline_numbers = [], {}
    for drop in [*summary["drops"], "all"]:
        masks = {
            (label[c.key], c.search, c.drop, c.seed): c.removed_blocks
            for c in main
            if drop == "all" or c.drop == drop
        }
        result = study_stats.headline_comparison(masks)
        headline_numbers[str(drop)] = dataclasses.asdict(result)
        verdict = {
            True: "calibration changes the mask more",
            False: "search changes the mask more",
            None: "undetermined",
        }[result.calibration_matters_more]
        headline_rows.append(
            [
                str(drop),
                _fmt(result.across_searches_same_objective),
                str(result.search_pairs),
                _fmt(result.across_objectives_same_search),
                str(result.objective_pairs),
                verdict,
            ]
        )
    sections.append(
        Section(
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
            headline_rows,
        )
    )

    ordered = sorted(
        cells,
        key=lambda c: (
            label[c.key],
            c.drop,
            c.prior,
            summary["searches"].index(c.search) if c.search in summary["searches"] else 99,
            c.seed,
        ),
    )
    main_ordered = [cell for cell in ordered if cell.prior == "single_block"]

    if ppl_tasks:
        rows = [
            [
                "dense",
                "0",
                "–",
                *([""] if several_seeds else []),
                _mask([], num_blocks),
                *[_fmt(dense.get(f"{t}/perplexity"), 2) for t in ppl_tasks],
            ]
        ]
        rows += [
            [
                *row_name(c),
                _mask(c.removed_blocks, num_blocks),
                *[_fmt(c.metrics.get(f"{t}/perplexity"), 2) for t in ppl_tasks],
            ]
            for c in main_ordered
        ]
        sections.append(
            Section(
                "Perplexity",
                ["Lower is better. ■ = removed block."],
                ["calibration", "M", "search", *(["seed"] if several_seeds else []), "mask", *ppl_tasks],
                rows,
            )
        )
    if acc_tasks:
        rows = [
            [
                "dense",
                "0",
                "–",
                *([""] if several_seeds else []),
                *[_fmt(dense.get(f"{t}/acc")) for t in acc_tasks],
                _fmt(mean_accuracy(dense, acc_tasks)),
            ]
        ]
        rows += [
            [
                *row_name(c),
                *[_fmt(c.metrics.get(f"{t}/acc")) for t in acc_tasks],
                _fmt(mean_accuracy(c.metrics, acc_tasks)),
            ]
            for c in main_ordered
        ]
        norm_tasks = sorted({k.split("/")[0] for m in all_metrics for k in m if k.endswith("/acc_norm")})
        sections.append(
            Section(
                "Zero-shot accuracy",
                [
                    "`acc` per task (higher is better); `acc_norm` "
                    + (f"(measured for {', '.join(norm_tasks)}) " if norm_tasks else "")
                    + "is in `study.json`."
                ],
                ["calibration", "M", "search", *(["seed"] if several_seeds else []), *acc_tasks, "mean"],
                rows,
            )
        )

    # one row per (calibration, M, search): seeds are summarised, since a later seed of a deterministic
    # search is answered from the memo and costs nothing
    by_search = defaultdict(list)
    for cell in main_ordered:
        by_search[(label[cell.key], cell.drop, cell.search)].append(cell)

    def largest(values):
        known = [v for v in values if v is not None]
        return max(known) if known else None

    def average(values):
        known = [v for v in values if v is not None and not math.isnan(v)]
        return sum(known) / len(known) if known else math.nan

    rows = [
        [
            name,
            str(drop),
            search,
            _fmt(largest([c.search_seconds for c in members]), 1),
            _fmt(largest([c.block_forwards for c in members])),
            _fmt(largest([c.subset_evaluations for c in members])),
            _fmt(average([c.calibration_loss for c in members]), 4),
            _fmt(average([primary_ppl(c.metrics) for c in members]), 2),
            _fmt(average([mean_accuracy(c.metrics, acc_tasks) for c in members])),
        ]
        for (name, drop, search), members in by_search.items()
    ]
    sections.append(
        Section(
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
                f"{primary} ppl",
                "mean acc",
            ],
            rows,
        )
    )

    groups = defaultdict(list)
    for cell in main_ordered:
        groups[(label[cell.key], cell.drop, cell.seed)].append(cell)
    agreement_rows, variance_rows, spearman_rows = [], [], []
    pooled_ppl, pooled_acc = [], []
    for (name, drop, seed), members in groups.items():
        masks = [c.removed_blocks for c in members]
        pairwise = study_stats.pairwise_jaccard(masks)
        agreement_rows.append(
            [
                name,
                str(drop),
                *([str(seed)] if several_seeds else []),
                str(len(members)),
                _fmt(pairwise.mean),
                f"[{_fmt(pairwise.minimum)}, {_fmt(pairwise.maximum)}]",
                _fmt(study_stats.full_overlap(masks)),
            ]
        )
        ppl = [primary_ppl(c.metrics) for c in members]
        acc = [mean_accuracy(c.metrics, acc_tasks) for c in members]
        loss = [c.calibration_loss if c.calibration_loss is not None else math.nan for c in members]
        variance_rows.append(
            [
                name,
                str(drop),
                *([str(seed)] if several_seeds else []),
                _fmt(study_stats.inter_method_variance(ppl), 4),
                _fmt(study_stats.inter_method_variance(acc), 6),
                _fmt(study_stats.inter_method_variance(loss), 6),
            ]
        )
        rho = study_stats.perplexity_accuracy_spearman(ppl, acc)
        spearman_rows.append(
            [name, str(drop), *([str(seed)] if several_seeds else []), str(len(members)), _fmt(rho)]
        )
        pooled_ppl += ppl
        pooled_acc += acc
    seed_col = ["seed"] if several_seeds else []
    sections.append(
        Section(
            "Mask agreement across searches",
            [
                "Per calibration configuration and budget: Jaccard similarity |A∩B|/|A∪B| over every pair "
                "of searches "
                "(mean and [min, max]) and the full overlap |∩S|/|∪S| over all of them."
            ],
            ["calibration", "M", *seed_col, "searches", "pairwise J mean", "J range", "full overlap"],
            agreement_rows,
        )
    )
    sections.append(
        Section(
            "Inter-method variance σ²",
            ["Population variance across the searches of one calibration configuration and budget."],
            ["calibration", "M", *seed_col, f"σ² {primary} ppl", "σ² mean acc", "σ² calibration loss"],
            variance_rows,
        )
    )
    pooled_rho = study_stats.perplexity_accuracy_spearman(pooled_ppl, pooled_acc)
    sections.append(
        Section(
            "Spearman ρ between perplexity rank and accuracy rank",
            [
                "Ranks over the searches of one cell (lowest perplexity = rank 1, highest accuracy = rank "
                "1): ρ = +1 "
                f"means perplexity orders the variants as accuracy does. Pooled over every variant: ρ = "
                f"{_fmt(pooled_rho)}."
            ],
            ["calibration", "M", *seed_col, "variants", "ρ"],
            spearman_rows,
            ["figures/rank_correlation.png"],
        )
    )

    if several_seeds:
        by_cell = defaultdict(list)
        for cell in main_ordered:
            by_cell[(label[cell.key], cell.drop, cell.search)].append(cell.removed_blocks)
        sections.append(
            Section(
                "Seed stability",
                ["Pairwise Jaccard between the masks one search finds with different seeds."],
                ["calibration", "M", "search", "seeds", "J mean", "full overlap"],
                [
                    [
                        n,
                        str(d),
                        s,
                        str(len(m)),
                        _fmt(study_stats.pairwise_jaccard(m).mean),
                        _fmt(study_stats.full_overlap(m)),
                    ]
                    for (n, d, s), m in by_cell.items()
                ],
            )
        )
    controls = [cell for cell in ordered if cell.prior == "random"]
    if controls:
        regular = {(label[c.key], c.drop, c.search, c.seed): c for c in main}
        rows = []
        for cell in controls:
            twin = regular.get((label[cell.key], cell.drop, cell.search, cell.seed))
            rows.append(
                [
                    *row_name(cell),
                    _fmt(study_stats.jaccard(cell.removed_blocks, twin.removed_blocks)) if twin else "–",
                    _fmt(twin.calibration_loss, 4) if twin else "–",
                    _fmt(cell.calibration_loss, 4),
                    _fmt(primary_ppl(cell.metrics), 2),
                    _fmt(mean_accuracy(cell.metrics, acc_tasks)),
                ]
            )
        sections.append(
            Section(
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
                    *seed_col,
                    "J vs single-block prior",
                    "loss (prior)",
                    "loss (random prior)",
                    f"{primary} ppl",
                    "mean acc",
                ],
                rows,
            )
        )
    sections.append(
        Section(
            "Figures",
            [],
            images=[*[f"figures/heatmap_m{drop}.png" for drop in summary["drops"]], "figures/tradeoff.png"],
        )
    )
    return sections, {
        "headline": headline_numbers,
        "pooled_spearman": pooled_rho,
        "primary_perplexity": primary,
        "accuracy_tasks": acc_tasks,
    }


# -------------------------------------------------------------------------------------------- rendering


def render_markdown(title: str, sections: Sequence[Section], reading: str | None = None) -> str:
    """The report as GitHub Markdown."""
    lines = [f"# {title}", ""]
    if reading:
        lines += ["## Reading", "", reading.strip(), ""]
    for section in sections:
        lines += [f"## {section.title}", ""]
        for paragraph in section.text:
            lines += [paragraph, ""]
        if section.header:
            lines.append("| " + " | ".join(section.header) + " |")
            lines.append("|" + "|".join("---" for _ in section.header) + "|")
            lines += [
                "| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in section.rows
            ]
            lines.append("")
        for image in section.images:
            lines += [f"![{Path(image).stem}]({image})", ""]
    return "\n".join(lines)


def render_html(title: str, sections: Sequence[Section], reading: str | None = None) -> str:
    """The report as one self-contained HTML page (figures linked relative to it)."""

    def inline(text: str) -> str:
        escaped = html.escape(text)
        parts = escaped.split("`")
        return "".join(f"<code>{part}</code>" if i % 2 else part for i, part in enumerate(parts))

    body = [f"<h1>{html.escape(title)}</h1>"]
    if reading:
        body += ["<h2>Reading</h2>"] + [f"<p>{inline(p)}</p>" for p in reading.strip().split("\n\n")]
    for section in sections:
        body.append(f"<h2>{html.escape(section.title)}</h2>")
        body += [f"<p>{inline(paragraph)}</p>" for paragraph in section.text]
        if section.header:
            body.append(
                "<table><thead><tr>"
                + "".join(f"<th>{html.escape(h)}</th>" for h in section.header)
                + "</tr></thead><tbody>"
            )
            body += [
                "<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>"
                for row in section.rows
            ]
            body.append("</tbody></table>")
        body += [
            f'<p><img src="{html.escape(image)}" alt="{html.escape(Path(image).stem)}"></p>'
            for image in section.images
        ]
    style = (
        "body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em}"
        "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 8px;"
        "text-align:right;font-variant-numeric:tabular-nums}th{background:#f3f3f3}img{max-width:100%}"
    )
    return (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{style}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n"
    )


# ---------------------------------------------------------------------------------------------- figures


def draw_figures(directory: Path, summary: dict, cells: Sequence, dense: dict) -> list[Path]:
    """Write the PNG figures; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    directory.mkdir(parents=True, exist_ok=True)
    num_blocks = summary["num_blocks"]
    objectives_data = defaultdict(set)
    for cell in cells:
        objectives_data[cell.objective].add(cell.data)
    multiple_data = any(len(data) > 1 for data in objectives_data.values())
    main = [cell for cell in cells if cell.prior == "single_block"]
    all_metrics = [dense] + [cell.metrics for cell in cells]
    ppl_tasks, acc_tasks = perplexity_tasks(all_metrics), accuracy_tasks(all_metrics)
    primary = ppl_tasks[0] if ppl_tasks else None
    written = []

    for drop in summary["drops"]:
        rows = defaultdict(lambda: np.zeros(num_blocks))
        counts = defaultdict(int)
        for cell in main:
            if cell.drop == drop:
                key = (calibration_label(cell, multiple_data), cell.search)
                for block in cell.removed_blocks:
                    rows[key][block] += 1
                counts[key] += 1
        if not rows:
            continue
        keys = sorted(
            rows, key=lambda k: (k[0], summary["searches"].index(k[1]) if k[1] in summary["searches"] else 99)
        )
        grid = np.stack([rows[k] / counts[k] for k in keys])
        figure, axes = plt.subplots(figsize=(max(6, 0.4 * num_blocks + 3), 0.35 * len(keys) + 1.5))
        axes.imshow(grid, cmap="Reds", vmin=0, vmax=1, aspect="auto")
        axes.set_yticks(range(len(keys)), [f"{k[0]} · {k[1]}" for k in keys], fontsize=8)
        axes.set_xticks(range(num_blocks), [str(i) for i in range(num_blocks)], fontsize=8)
        axes.set_xlabel("block index")
        for boundary in [i - 0.5 for i in range(1, len(keys)) if keys[i][0] != keys[i - 1][0]]:
            axes.axhline(boundary, color="black", linewidth=1)
        seeds = len(summary["seeds"])
        axes.set_title(f"Removed blocks, M = {drop}" + (f" (share of {seeds} seeds)" if seeds > 1 else ""))
        figure.tight_layout()
        path = directory / f"heatmap_m{drop}.png"
        figure.savefig(path, dpi=120)
        plt.close(figure)
        written.append(path)

    labels = sorted({calibration_label(c, multiple_data) for c in main})
    colors = {name: plt.cm.tab10(i % 10) for i, name in enumerate(labels)}
    markers = {name: "osD^v<>pP*X"[i % 11] for i, name in enumerate(summary["searches"])}
    drops = summary["drops"]
    figure, axes_list = plt.subplots(1, len(drops), figsize=(5.5 * len(drops), 4.5), squeeze=False)
    for axes, drop in zip(axes_list[0], drops, strict=True):
        for cell in main:
            if cell.drop != drop:
                continue
            x = cell.metrics.get(f"{primary}/perplexity", math.nan) if primary else math.nan
            y = mean_accuracy(cell.metrics, acc_tasks)
            axes.scatter(
                x,
                y,
                color=colors[calibration_label(cell, multiple_data)],
                marker=markers.get(cell.search, "o"),
                s=45,
                alpha=0.85,
            )
        if primary and f"{primary}/perplexity" in dense:
            axes.scatter(
                dense[f"{primary}/perplexity"],
                mean_accuracy(dense, acc_tasks),
                color="black",
                marker="*",
                s=150,
                label="dense",
            )
        xs = [x for x in (c.metrics.get(f"{primary}/perplexity") for c in main if c.drop == drop) if x]
        if xs and max(xs) / min(xs) > 3:  # log scale only pays off over a wide range
            axes.set_xscale("log")
        axes.set_xlabel(f"{primary} perplexity")
        axes.set_ylabel("mean accuracy")
        axes.set_title(f"M = {drop}")
        axes.grid(alpha=0.3)
    handles = [plt.Line2D([], [], color=colors[n], marker="o", linestyle="", label=n) for n in labels]
    handles += [plt.Line2D([], [], color="gray", marker=m, linestyle="", label=s) for s, m in markers.items()]
    handles.append(plt.Line2D([], [], color="black", marker="*", linestyle="", markersize=10, label="dense"))
    figure.legend(handles=handles, loc="center right", fontsize=8)
    figure.suptitle("Perplexity vs accuracy trade-off")
    figure.tight_layout(rect=(0, 0, 0.82, 1))
    path = directory / "tradeoff.png"
    figure.savefig(path, dpi=120)
    plt.close(figure)
    written.append(path)

    panels = sorted({(calibration_label(c, multiple_data), c.drop) for c in main})
    columns = min(4, max(1, len(panels)))
    rows_count = math.ceil(len(panels) / columns) if panels else 1
    figure, axes_grid = plt.subplots(
        rows_count, columns, figsize=(4 * columns, 3.8 * rows_count), squeeze=False
    )
    for axes in axes_grid.flat[len(panels) :]:
        axes.axis("off")
    for axes, (name, drop) in zip(axes_grid.flat, panels, strict=False):
        members = [c for c in main if calibration_label(c, multiple_data) == name and c.drop == drop]
        ppl = [c.metrics.get(f"{primary}/perplexity", math.nan) if primary else math.nan for c in members]
        acc = [mean_accuracy(c.metrics, acc_tasks) for c in members]
        usable = [
            (p, a, c)
            for p, a, c in zip(ppl, acc, members, strict=True)
            if not (math.isnan(p) or math.isnan(a))
        ]
        if usable:
            ppl_rank = study_stats.rank([p for p, _, _ in usable])
            acc_rank = study_stats.rank([a for _, a, _ in usable], descending=True)
            for x, y, (_, _, cell) in zip(ppl_rank, acc_rank, usable, strict=True):
                axes.scatter(x, y, marker=markers.get(cell.search, "o"), color=colors[name], s=45)
                axes.annotate(cell.search, (x, y), fontsize=6, xytext=(3, 3), textcoords="offset points")
            top = len(usable) + 0.5
            axes.plot([0.5, top], [0.5, top], color="gray", linewidth=0.8, linestyle="--")
        rho = study_stats.perplexity_accuracy_spearman(ppl, acc)
        axes.set_title(f"{name}, M = {drop}: ρ = {_fmt(rho, 2)}", fontsize=9)
        axes.set_xlabel("perplexity rank")
        axes.set_ylabel("accuracy rank")
    figure.tight_layout()
    path = directory / "rank_correlation.png"
    figure.savefig(path, dpi=120)
    plt.close(figure)
    written.append(path)
    return written


# ------------------------------------------------------------------------------------------------- entry


def write_report(out: Path, summary: dict, cells: Sequence, dense: dict, reading: str | None = None) -> Path:
    """Write ``README.md``, ``report.html``, ``study.json`` and ``figures/`` into ``out``.

    Args:
        out: the report directory.
        summary: the study's setup (:func:`pruning.study.plan_summary`).
        cells: finished cells (:class:`pruning.study.CellResult`), metrics filled in.
        dense: the dense model's metrics, ``"task/metric" -> value``.
        reading: optional hand-written interpretation placed at the top (kept in ``reading.md``).

    Returns:
        The path of ``README.md``.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    reading_file = out / "reading.md"
    if reading is None and reading_file.is_file():
        reading = reading_file.read_text()
    elif reading is not None:
        reading_file.write_text(reading)
    sections, numbers = build_sections(summary, cells, dense)
    draw_figures(out / "figures", summary, cells, dense)
    title = f"Depth-pruning study: {Path(summary['model']).name}"
    (out / "README.md").write_text(render_markdown(title, sections, reading))
    (out / "report.html").write_text(render_html(title, sections, reading))
    (out / "study.json").write_text(
        json.dumps(
            {"summary": summary, "dense": dense, **numbers, "cells": [dataclasses.asdict(c) for c in cells]},
            indent=1,
            default=str,
        )
    )
    return out / "README.md"
