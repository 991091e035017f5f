"""The demo's final table: every variant against dense, with the load test's ratios and 95 % intervals.

Rows come from :func:`depthprune.cli.demo.summary_rows`; this module turns a load-test comparison entry
into a row's speed columns, adds the A/A control's row and prints three tables that read whole at 100
columns, in a terminal or a log: what each variant is, what it gave up (quality retained against dense,
paired over the same items, in-domain and out-of-domain side by side), then how fast the served ones are.
"""

from __future__ import annotations

from pathlib import Path

SPEED_KEYS = ("output_throughput_ratio", "mean_tpot_ratio", "median_e2el_ratio", "p99_e2el_ratio")
SPEED_KEYS += ("ideal_speedup", "fraction_of_ideal_speedup", "speedup_verdict")
SPEED_KEYS += tuple(
    f"{key}_ci95" for key in ("output_throughput_ratio", "mean_tpot_ratio", "fraction_of_ideal_speedup")
)


def speed_columns(comparison: dict | None) -> dict:
    """Throughput and latency ratios to dense, with 95 % intervals, from the load test's comparison entry."""
    if comparison is None:
        return dict.fromkeys(SPEED_KEYS)
    ratios, intervals = comparison["ratios"], comparison.get("ratios_ci95") or {}
    return {
        "output_throughput_ratio": ratios.get("output_throughput"),
        "output_throughput_ratio_ci95": comparison.get("output_throughput_speedup_ci95"),
        "speedup_verdict": comparison.get("verdict"),
        "mean_tpot_ratio": ratios.get("mean_tpot_ms"),
        "mean_tpot_ratio_ci95": intervals.get("mean_tpot_ms"),
        "median_e2el_ratio": ratios.get("median_e2el_ms"),
        "p99_e2el_ratio": ratios.get("p99_e2el_ms"),
        "ideal_speedup": comparison.get("ideal_speedup"),
        "fraction_of_ideal_speedup": comparison.get("fraction_of_ideal_speedup"),
        "fraction_of_ideal_speedup_ci95": comparison.get("fraction_of_ideal_speedup_ci95"),
    }


def aa_row(aa: dict) -> dict:
    """The A/A control's row: dense measured again as its own arm, the run's noise floor."""
    row = dict(variant="dense (A/A)", name="dense", removed_blocks=[], objective="noise floor", search="-")
    row["quality"] = None  # the same weights as dense: nothing to compare
    row.update(
        dict.fromkeys(("calibration_loss", "perplexity", "qa_accuracy", *SPEED_KEYS)), ideal_speedup=1.0
    )
    for key, source in (
        ("output_throughput_ratio", "output_throughput_ratio"),
        ("mean_tpot_ratio", "mean_tpot_ms_ratio"),
    ):
        row[key], row[f"{key}_ci95"] = aa.get(source), aa.get(f"{source}_ci95")
    return row


TABLE_WIDTH = 100
"""Columns the final tables are laid out for, on a terminal or in a log alike: every number and interval
whole (``tests/test_demo_table.py`` renders them at this width)."""


def removed_text(blocks: list[int]) -> str:
    """``3, 5, 12-15``: removed blocks with runs shortened, separated so that a narrow column wraps between
    them, never inside a number."""
    runs: list[list[int]] = []
    for block in sorted(blocks):
        if runs and block == runs[-1][-1] + 1:
            runs[-1].append(block)
        else:
            runs.append([block])
    return (
        ", ".join(f"{run[0]}-{run[-1]}" if len(run) > 2 else ", ".join(map(str, run)) for run in runs) or "-"
    )


def _fmt(value, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def _table(title: str, columns: list[tuple[str, str]]):
    """A table of ``(header, kind)`` columns: ``text`` (left, whole), ``wrap`` (left, may wrap between
    words) or ``number`` (right, whole); no vertical rules and no edges, so ``TABLE_WIDTH`` holds more."""
    from rich import box
    from rich.table import Table

    table = Table(title=title, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, title_justify="left")
    for header, kind in columns:
        justify = "right" if kind == "number" else "left"
        table.add_column(header, justify=justify, no_wrap=kind != "wrap", overflow="fold")
    return table


def variants_table(rows: list[dict], plan):
    """Which blocks each variant removes, under which objective and search, and how well it fit."""
    model = f"{plan.model}, M = {plan.drop} of {plan.num_blocks}"
    table = _table(
        f"depthprune demo: every variant against dense ({model})",
        [("variant", "text"), ("objective", "text"), ("search", "text"), ("removed", "wrap")]
        + [(header, "number") for header in ("calib.", "val.", "fit")],
    )
    for row in rows:
        table.add_row(
            row["variant"],
            row["objective"],
            row["search"],
            removed_text(row["removed_blocks"]),
            _fmt(row["calibration_loss"]),
            _fmt(row.get("validation_loss")),
            _fmt(row.get("fit")),
        )
    return table


REAL_QUALITY_TASKS = (
    ("pydoc", "in-domain\npydoc ppl"),
    ("pydoc_cloze", "in-domain\npydoc-cloze acc"),
    ("gcide", "out-of-domain\nGCIDE ppl"),
    ("gcide_define", "out-of-domain\nGCIDE-define acc"),
)
"""A real model's quality columns (the ``offline`` suite): both objectives calibrate on Python's
documentation, so pydoc's test split is in-domain and the GCIDE dictionary out-of-domain."""
DEMO_QUALITY_TASKS = (("demo_text", "held-out\ntext ppl"), ("demo_qa", "held-out\nQA acc"))
"""The demo model's quality columns: its own held-out text and questions (it knows no other domain)."""


def quality_tasks(plan) -> tuple[tuple[str, str], ...]:
    """``(task, header)`` of each quality column of ``plan``'s table."""
    return DEMO_QUALITY_TASKS if plan.is_demo_model else REAL_QUALITY_TASKS


def _interval_text(point, interval, digits: int) -> str:
    if point is None:
        return "-"
    if not interval:
        return f"{point:.{digits}f}"
    low, high = interval
    return f"{point:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"


def quality_cell(record: dict | None, baseline: bool) -> str:
    """Dense: its value and 95 % interval; a variant: % of dense retained, with the paired interval."""
    if not record:
        return "-"
    if baseline:
        if "perplexity" not in record:
            return _interval_text(record.get("accuracy"), record.get("accuracy_ci95"), 2)
        value = record["perplexity"]  # three or four significant digits keep the column narrow
        return _interval_text(value, record.get("perplexity_ci95"), 1 if value is None or value < 100 else 0)
    verdict = record.get("verdict") or ""
    if verdict.startswith("not paired"):
        return "not paired"
    return _interval_text(record.get("retention"), record.get("retention_ci95"), 0)


def retention_table(rows: list[dict], plan):
    """What each evaluated variant kept of dense's quality, task by task, paired over the same items."""
    tasks = quality_tasks(plan)
    dense = next((row.get("quality") or {} for row in rows if row["variant"] == "dense"), {})
    headers = []
    for task, header in tasks:
        n = (dense.get(task) or {}).get("n")
        headers.append((header if n is None else f"{header}\nn = {n}", "number"))
    title = "quality kept: % of dense [95 %], paired over the same items"
    table = _table(title, [("variant", "text"), *headers])
    for row in rows:
        quality = row.get("quality")
        if quality is None:
            continue  # the A/A control: the same weights as dense
        cells = [quality_cell(quality.get(task), row["variant"] == "dense") for task, _ in tasks]
        table.add_row(row["variant"], *cells)
    return table


def quality_notes(rows: list[dict], plan) -> list[str]:
    """Per variant, the tasks it measurably lost (or gained) on; the rest showed no measurable change."""
    notes = []
    for row in rows:
        quality = row.get("quality")
        if not quality or row["variant"] == "dense":
            continue
        by_verdict: dict[str, list[str]] = {}
        for task, header in quality_tasks(plan):
            verdict = (quality.get(task) or {}).get("verdict")
            if verdict in ("worse", "better"):
                by_verdict.setdefault(verdict, []).append(header.split("\n")[-1])
        said = [f"{verdict} than dense on {', '.join(on)}" for verdict, on in sorted(by_verdict.items())]
        notes.append(f"{row['variant']}: {'; '.join(said) or 'no measurable change on any task'}.")
    return notes


def speed_table(rows: list[dict]):
    """Each served variant's speed against dense under the same load, with 95 % intervals."""
    from loadtest.intervals import format_ratio, from_json

    columns = ["variant", "out tok/s × [95 %]", "TPOT × [95 %]", "p50 E2E ×", "ideal ×", "of ideal [95 %]"]
    kinds = [(name, "text" if name == "variant" else "number") for name in columns]
    table = _table("served under the same load as dense (load test)", kinds)
    for row in rows:
        if row["variant"] != "dense" and row["output_throughput_ratio"] is None:
            continue  # not served: the searches' other outcomes
        problem = (row["speedup_verdict"] or "").startswith("measurement problem")
        ratio = from_json(row["output_throughput_ratio"], row["output_throughput_ratio_ci95"])
        fraction = from_json(row["fraction_of_ideal_speedup"], row["fraction_of_ideal_speedup_ci95"])
        table.add_row(
            row["variant"],
            "measurement problem" if problem else format_ratio(ratio, "x"),
            format_ratio(from_json(row["mean_tpot_ratio"], row["mean_tpot_ratio_ci95"])),
            _fmt(row["median_e2el_ratio"], 2),
            _fmt(row["ideal_speedup"], 2),
            "measurement problem" if problem else format_ratio(fraction),
        )
    return table


def verdict_notes(rows: list[dict]) -> list[str]:
    """One line per row whose speed-up is not a result: no measurable change, or a measurement problem."""
    notes = []
    for row in rows:
        verdict = row.get("speedup_verdict")
        if verdict == "no measurable change":
            notes.append(
                f"{row['variant']}: no measurable change (its throughput interval holds 1): one block of "
                "rounds did not decide it; `depthprune demo --precise` adds rounds until every interval "
                "is ±2 %."
            )
        elif verdict:
            notes.append(f"{row['variant']}: {verdict}.")
    return notes


PATCH_REASON = "the same blocks, shapes and parameter count: the patch is folded into existing weights"


def speed_notes(rows: list[dict]) -> list[str]:
    """One line per row that is not load-tested because its speed is another row's (a repaired child, a
    variant keeping as many blocks of each kind as one load-tested)."""
    return [
        f"{row['variant']}: not load-tested; its speed is {row['speed_of']}'s by construction ("
        + row.get("speed_because", PATCH_REASON)
        + ")."
        for row in rows
        if row.get("speed_of")
    ]


def render(rows: list[dict], plan, console) -> None:
    """The three tables and their notes, on ``console``."""
    console.print(variants_table(rows, plan))
    console.print(
        "calib./val. = calibration/validation loss of the search; fit = fit to serve. "
        "#N = registry id (`depthprune variants show N`)."
        + (
            " +patch = the variant above repaired without training (heal --method patch); its val. is on "
            "its parent's validation data."
            if any(row.get("parent") for row in rows)
            else ""
        )
    )
    console.print()
    console.print(retention_table(rows, plan))
    for note in quality_notes(rows, plan):
        console.print(note)
    console.print(
        "dense: its value [95 % interval] on n windows or items; a variant: % of dense's quality kept "
        "(perplexity: dense / variant; accuracy: variant / dense, acc_norm), paired bootstrap over the same "
        "items; a twin (same blocks) shares its evaluation."
    )
    console.print()
    console.print(speed_table(rows))
    for note in verdict_notes(rows) + speed_notes(rows):
        console.print(note)
    console.print(
        "× = ratio to dense under the same load (throughput: higher is better; latency: lower), 95 % "
        "interval in brackets; dense (A/A) = dense measured again as its own arm: the noise floor."
    )


def print_table(rows: list[dict], out: Path, plan) -> None:
    """The final tables on stderr, laid out for :data:`TABLE_WIDTH` columns wherever stderr goes (a terminal,
    a pipe, a CI log); ``plan`` is the demo's ``DemoPlan``."""
    from rich.console import Console

    console = Console(stderr=True, width=TABLE_WIDTH)
    render(rows, plan, console)
    console.print(f"report and plots: {out / 'loadtest'}; summary: {out / 'summary.json'}")
