"""The demo's final tables read whole at 100 columns, in a terminal or a log: no number or interval cut."""

from __future__ import annotations

import io
import re
from types import SimpleNamespace

from rich.console import Console

from depthprune.cli.demo import DemoConfig, plan_demo
from depthprune.cli.demo_table import TABLE_WIDTH, aa_row, removed_text, render, speed_columns

SMOLLM2_REMOVED = [3, 5, 7, 11, 13, 17, 21, 25]  # M = 8 of 30, no two adjacent: the longest list


def comparison(speedup: list[float], verdict: str | None = None) -> dict:
    """A load-test comparison entry with an output-throughput speed-up ``[point, low, high]``."""
    point, low, high = speedup
    ideal = 30 / 22
    return {
        "ratios": {"output_throughput": point, "mean_tpot_ms": 0.781, "median_e2el_ms": 0.764},
        "ratios_ci95": {"mean_tpot_ms": [0.752, 0.813]},
        "output_throughput_speedup_ci95": [low, high],
        "verdict": verdict,
        "ideal_speedup": ideal,
        "fraction_of_ideal_speedup": point / ideal,
        "fraction_of_ideal_speedup_ci95": [low / ideal, high / ideal],
    }


def row(variant: str, objective: str, search: str, removed: list[int], speed: dict | None) -> dict:
    return {
        "variant": variant,
        "name": variant,
        "removed_blocks": removed,
        "objective": objective,
        "search": search,
        "calibration_loss": 3.4567,
        "validation_loss": 3.5678,
        "fit": True,
        "perplexity": 2493.123,
        "qa_accuracy": 0.9444,
        "quality": DENSE_QUALITY if variant == "dense" else VARIANT_QUALITY,
        **speed_columns(speed),
    }


DENSE_QUALITY = {
    "pydoc": {"n": 341, "perplexity": 2493.123, "perplexity_ci95": [2301.456, 2712.789]},
    "pydoc_cloze": {"n": 341, "accuracy": 0.9444, "accuracy_ci95": [0.9111, 0.9642]},
    "gcide": {"n": 500, "perplexity": 28.04, "perplexity_ci95": [26.12, 30.21]},
    "gcide_define": {"n": 500, "accuracy": 0.772, "accuracy_ci95": [0.733, 0.808]},
}
VARIANT_QUALITY = {  # the widest cells: three-digit retention on both sides of 100
    "pydoc": {"retention": 38.21, "retention_ci95": [35.02, 41.7], "verdict": "worse"},
    "pydoc_cloze": {"retention": 99.6, "retention_ci95": [96.4, 102.9], "verdict": "no measurable change"},
    "gcide": {"retention": 101.2, "retention_ci95": [100.1, 102.5], "verdict": "better"},
    "gcide_define": {"verdict": "not paired: items differ (500 in the baseline, 24 in the model, 24 shared)"},
}


def worst_case_rows() -> list[dict]:
    aa = {
        "output_throughput_ratio": 1.0043,
        "output_throughput_ratio_ci95": [0.9712, 1.0385],
        "mean_tpot_ms_ratio": 0.9987,
        "mean_tpot_ms_ratio_ci95": [0.9811, 1.0166],
    }
    return [
        row("dense", "-", "-", [], None),
        aa_row(aa),
        row("ppl-best", "perplexity", "block_influence", SMOLLM2_REMOVED,
            comparison([1.2734, 1.2411, 1.3067])),
        row("ce-best", "task_ce", "one_shot", [12, 13, 14, 15, 18, 20, 22, 29], comparison([1.02, 0.97, 1.07],
            "no measurable change")),
        row("#123", "perplexity", "one_shot", SMOLLM2_REMOVED, None),
        row("#124", "task_ce", "block_influence", SMOLLM2_REMOVED, None),
    ]  # fmt: skip


def with_patch_row(rows: list[dict]) -> list[dict]:
    """The rows with the demo's repaired ppl-best right after it (as in :mod:`depthprune.cli.demo_repair`)."""
    from depthprune.cli.demo_repair import Repaired, repaired_row, with_repaired

    parent = next(item for item in rows if item["variant"] == "ppl-best")
    child = SimpleNamespace(
        removed_blocks=SMOLLM2_REMOVED,
        objective="perplexity",
        search="block_influence",
        quality={"validation_loss": 3.1234},
        fit=True,
    )
    quality = {**VARIANT_QUALITY, "pydoc": {"retention": 61.4, "retention_ci95": [57.25, 65.5]}}
    metrics = {"perplexity": 30.87, "qa_accuracy": 0.91}
    return with_repaired(rows, repaired_row(Repaired("child", parent["name"], 80.0), child, metrics, quality))


def rendered(rows: list[dict], plan, width: int = TABLE_WIDTH) -> str:
    stream = io.StringIO()  # not a terminal: what a CI log or `make demo | tee` gets
    render(rows, plan, Console(file=stream, width=width, force_terminal=False, color_system=None))
    return stream.getvalue()


def test_the_tables_read_whole_at_100_columns(tmp_path):
    plan = plan_demo(DemoConfig(out=tmp_path), num_blocks=30)
    rows = worst_case_rows()
    text = rendered(rows, plan)
    assert max(len(line) for line in text.splitlines()) <= TABLE_WIDTH
    assert "…" not in text
    for interval in (
        "1.27x [1.24, 1.31]",  # ppl-best's speed-up
        "1.02x [0.97, 1.07]",  # ce-best's, which holds 1
        "1.00x [0.97, 1.04]",  # the A/A row
        "0.78 [0.75, 0.81]",  # a TPOT ratio
        "1.00 [0.98, 1.02]",  # the A/A TPOT ratio
        "0.93 [0.91, 0.96]",  # fraction of the ideal speed-up
    ):
        assert interval in text, interval
    for value in ("3.457", "3.568", "1.36", "0.76", "block_influence", "dense (A/A)"):
        assert value in text, value
    # quality: dense's values and intervals, the variants' retention with paired intervals, n per column
    for cell in ("2493 [2301, 2713]", "0.94 [0.91, 0.96]", "28.0 [26.1, 30.2]", "0.77 [0.73, 0.81]"):
        assert cell in text, cell
    for cell in ("38 [35, 42]", "100 [96, 103]", "101 [100, 102]", "not paired", "n = 341", "n = 500"):
        assert cell in text, cell
    assert "in-domain" in text and "out-of-domain" in text
    assert "ppl-best: better than dense on GCIDE ppl; worse than dense on pydoc ppl." in text
    assert "ce-best: no measurable change" in text
    # Every row is there; the removed blocks wrap between numbers, never inside one.
    for variant in ("dense", "ppl-best", "ce-best", "#123", "#124"):
        assert re.search(rf"^{re.escape(variant)} ", text, re.M), variant
    numbers = {int(n) for n in re.findall(r"(?<![\d.\[])(\d+)(?=,|\s|$)(?![.\d])", text)}
    assert set(SMOLLM2_REMOVED) <= numbers and "12-15" in text


def test_the_patched_row_sits_beside_its_parent_with_quality_and_no_speed_of_its_own(tmp_path):
    plan = plan_demo(DemoConfig(out=tmp_path), num_blocks=30)
    rows = with_patch_row(worst_case_rows())
    assert [item["variant"] for item in rows][2:4] == ["ppl-best", "ppl-best+patch"]
    text = rendered(rows, plan)
    assert max(len(line) for line in text.splitlines()) <= TABLE_WIDTH and "…" not in text
    lines = [line for line in text.splitlines() if line.startswith("ppl-best+patch ")]
    assert len(lines) == 2  # the variants table and the quality table; not the speed table
    assert "block_influence+patch" in lines[0] and "3.123" in lines[0]
    assert "61 [57, 66]" in lines[1]  # retention with its paired interval
    note = "ppl-best+patch: not load-tested; its speed is ppl-best's by construction"
    assert note in " ".join(text.split())


def test_a_measurement_problem_shows_no_number():
    plan = plan_demo(DemoConfig(), num_blocks=30)
    rows = [
        row(
            "ppl-best",
            "perplexity",
            "one_shot",
            [1, 2],
            comparison([1.6, 1.55, 1.65], "measurement problem: x"),
        )
    ]
    text = rendered(rows, plan)
    assert "measurement problem" in text and "1.60x" not in text


def test_removed_blocks_are_shortened_to_runs():
    assert removed_text([]) == "-"
    assert removed_text([7, 3, 4]) == "3, 4, 7"
    assert removed_text([12, 13, 14, 15, 18]) == "12-15, 18"
