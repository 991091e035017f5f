"""The demo's final table: every variant against dense, with the load test's ratios and 95 % intervals.

Rows come from :func:`depthprune.cli.demo.summary_rows`; this module turns a load-test comparison entry
into a row's speed columns, adds the A/A control's row and prints the table.
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


def print_table(rows: list[dict], out: Path, plan) -> None:
    """The final table, on stderr, wide enough for every column; ``plan`` is the demo's ``DemoPlan``."""
    from rich.console import Console
    from rich.table import Table

    from loadtest.intervals import speedup_text

    def fmt(value, digits=3):
        if value is None:
            return "-"
        return f"{value:.{digits}f}" if isinstance(value, float) else str(value)

    accuracy = "QA acc" if plan.is_demo_model else "cloze acc"
    perplexity = "ppl" if plan.is_demo_model else "pydoc ppl"
    model = f"{plan.model}, M = {plan.drop} of {plan.num_blocks}"
    table = Table(title=f"depthprune demo: every variant against dense ({model})")
    columns = ["variant", "removed", "objective", "search", "calib. loss", "val. loss", "fit", perplexity]
    columns += [accuracy, "out tok/s × [95 %]", "TPOT × [95 %]", "p50 E2E ×", "ideal ×", "of ideal [95 %]"]
    for column in columns:
        left = column in ("variant", "removed", "objective", "search")
        table.add_column(column, justify="left" if left else "right", no_wrap=True)
    for row in rows:
        verdict = row["speedup_verdict"]
        table.add_row(
            row["variant"],
            ",".join(map(str, row["removed_blocks"])) or "-",
            row["objective"],
            row["search"],
            fmt(row["calibration_loss"]),
            fmt(row.get("validation_loss")),
            fmt(row.get("fit")),
            fmt(row["perplexity"], 2),
            fmt(row["qa_accuracy"]),
            speedup_text(row["output_throughput_ratio"], row["output_throughput_ratio_ci95"], verdict),
            speedup_text(row["mean_tpot_ratio"], row["mean_tpot_ratio_ci95"], None, ""),
            fmt(row["median_e2el_ratio"], 2),
            fmt(row["ideal_speedup"], 2),
            speedup_text(
                row["fraction_of_ideal_speedup"], row["fraction_of_ideal_speedup_ci95"], verdict, ""
            ),
        )
    # Wide enough for every column even when stderr is a pipe (CI logs, `make demo | tee`).
    console = Console(stderr=True, width=max(Console(stderr=True).width, 200))
    console.print(table)
    console.print(f"report and plots: {out / 'loadtest'}; summary: {out / 'summary.json'}")
    console.print(
        "#N = registry id (`depthprune variants show N`); "
        "× = ratio to dense under the same load (throughput: higher is better; latency: lower), 95 % "
        "interval in brackets; dense (A/A) = dense measured again as its own arm: the noise floor."
    )
