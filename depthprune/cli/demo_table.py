"""The demo's final table: every variant against dense, with the load test's ratios and 95 % intervals.

Rows come from :func:`depthprune.cli.demo.summary_rows`; this module turns a load-test comparison entry
into a row's speed columns, adds the A/A control's row and prints two tables that read whole at 100 columns,
in a terminal or a log: what each variant is and gave up, then how fast the served ones are.
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


def quality_table(rows: list[dict], plan):
    """Which blocks each variant removes, under which objective and search, and what it gave up."""
    model = f"{plan.model}, M = {plan.drop} of {plan.num_blocks}"
    table = _table(
        f"depthprune demo: every variant against dense ({model})",
        [("variant", "text"), ("objective", "text"), ("search", "text"), ("removed", "wrap")]
        + [(header, "number") for header in ("calib.", "val.", "fit", "ppl", "acc")],
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
            _fmt(row["perplexity"], 2),
            _fmt(row["qa_accuracy"]),
        )
    return table


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
            notes.append(f"{row['variant']}: no measurable change (its throughput interval holds 1).")
        elif verdict:
            notes.append(f"{row['variant']}: {verdict}.")
    return notes


def render(rows: list[dict], plan, console) -> None:
    """Both tables and their notes, on ``console``."""
    accuracy = "QA accuracy" if plan.is_demo_model else "pydoc-cloze accuracy"
    perplexity = "held-out text perplexity" if plan.is_demo_model else "pydoc test perplexity"
    console.print(quality_table(rows, plan))
    console.print(
        f"calib./val. = calibration/validation loss of the search; fit = fit to serve; ppl = {perplexity}; "
        f"acc = {accuracy}. #N = registry id (`depthprune variants show N`)."
    )
    console.print()
    console.print(speed_table(rows))
    for note in verdict_notes(rows):
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
