"""Trustworthy comparisons: intervals on per-round ratios with known answers, the verdicts drawn from them,
the stopping rule, the A/A arm and distinct prompts per arm, and the whole path against fake vLLM servers.
The real-engine run is in test_loadtest_vllm.py."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from depthprune.testing.cli import run_cli
from depthprune.testing.fake_vllm import create_fake_app, serve_in_thread
from depthprune.testing.servers import free_port
from ground.core.errors import UserError
from loadtest.benchmark import Measurement, build_result
from loadtest.compare import BlockCounts
from loadtest.config import LoadConfig
from loadtest.intervals import estimate_ratio, format_ratio, speedup_verdict
from loadtest.precision import StopRule
from loadtest.prompts import WordTokenizer, build_prompts
from loadtest.report import markdown_report
from loadtest.runner import RunResult
from loadtest.session import RoundPromptPlan

# --- intervals with known answers ------------------------------------------------------------------------


def test_constant_ratios_give_a_zero_width_interval_at_the_ratio():
    estimate = estimate_ratio([1.25] * 5)
    assert estimate.point == pytest.approx(1.25)
    assert estimate.ci95 == pytest.approx([1.25, 1.25])
    assert estimate.precision == pytest.approx(0.0) and estimate.rounds == 5


def test_t_interval_of_log_ratios_matches_the_closed_form():
    # log-ratios 0.1, 0.2, 0.3: mean 0.2, sd 0.1, n 3. Student's t with 2 degrees of freedom has the closed
    # form quantile (2p - 1) / sqrt(2p(1 - p)); at p = 0.975 that is 4.3027.
    t = 0.95 / math.sqrt(2 * 0.975 * 0.025)
    half = t * 0.1 / math.sqrt(3)
    estimate = estimate_ratio([math.exp(0.1), math.exp(0.2), math.exp(0.3)])
    assert estimate.point == pytest.approx(math.exp(0.2))
    assert estimate.ci95 == pytest.approx([math.exp(0.2 - half), math.exp(0.2 + half)])
    assert estimate.precision == pytest.approx(math.exp(half) - 1)
    # Symmetric on the log scale: a ratio and its inverse give mirrored intervals.
    inverse = estimate_ratio([math.exp(-0.1), math.exp(-0.2), math.exp(-0.3)])
    assert inverse.low == pytest.approx(1 / estimate.high)


def test_too_few_rounds_give_no_interval():
    assert estimate_ratio([]).point is None
    one = estimate_ratio([1.1, None, 0.0, math.inf])  # unusable rounds are skipped
    assert one.point == pytest.approx(1.1) and one.ci95 is None and one.precision is None
    assert format_ratio(one, "x") == "1.10x"


def test_verdicts():
    ideal = 4 / 3
    impossible = estimate_ratio([1.50, 1.55, 1.60])  # 1.13-1.20 of the ideal
    assert speedup_verdict(impossible, impossible.scaled(ideal)).startswith("measurement problem")
    # Above the ideal, but the interval reaches below it: not a fault.
    noisy_high = estimate_ratio([1.3, 1.45, 1.4, 1.5])
    assert noisy_high.scaled(ideal).point > 1 and noisy_high.scaled(ideal).low < 1
    assert speedup_verdict(noisy_high, noisy_high.scaled(ideal)) is None
    assert speedup_verdict(estimate_ratio([0.95, 1.05, 1.02]), None) == "no measurable change"
    assert speedup_verdict(estimate_ratio([1.2, 1.25, 1.3]), None) is None
    assert format_ratio(estimate_ratio([1.27] * 3), "x") == "1.27x [1.27, 1.27]"


# --- results and reports from synthetic rounds -----------------------------------------------------------


def rounds_of(throughputs: list[float], tpot_ms: list[float]) -> list[dict]:
    """Per-round metrics with every key the comparison reads."""
    rounds = []
    for throughput, tpot in zip(throughputs, tpot_ms):
        metrics = {"request_throughput": 1.0, "total_token_throughput": 100.0, "failed": 0}
        for key in ("ttft", "tpot", "itl", "e2el"):
            for stat in ("mean", "median", "p99"):
                metrics[f"{stat}_{key}_ms"] = tpot
        metrics["output_throughput"] = throughput
        rounds.append(metrics)
    return rounds


class FakeMeasurement(Measurement):
    """A measurement whose per-round metrics are given (no requests behind them)."""

    def __init__(self, per_round: dict[str, list[dict]]):
        super().__init__(rate=math.inf, runs=[RunResult(model, 0, math.inf, 1.0) for model in per_round])
        self._per_round = per_round

    def per_round_metrics(self, config):
        return self._per_round

    def pooled_metrics(self, config):
        return {model: rounds[0] for model, rounds in self._per_round.items()}


def synthetic_result(per_round: dict[str, list[dict]]) -> dict:
    counts = {"dense": BlockCounts(16, 0), "dense (A/A)": BlockCounts(16, 0)}
    counts.update({model: BlockCounts(16, 4) for model in per_round if model.startswith("v")})
    return build_result(
        target="http://x",
        targets=dict.fromkeys(per_round, "http://x"),
        config=LoadConfig(rounds=3),
        baseline="dense",
        counts=counts,
        measurement=FakeMeasurement(per_round),
        tokenizer="test",
        aa_arm="dense (A/A)",
        precision={"headline": "output_throughput", "target": 0.03, "reached": 0.02, "stop_reason": "done"},
    )


def test_result_carries_intervals_aa_and_verdicts():
    per_round = {
        "dense": rounds_of([100, 80, 90], [10, 12, 11]),
        "dense (A/A)": rounds_of([101, 79, 91], [10, 12, 11]),
        "v": rounds_of([127, 101.6, 114.3], [7.5, 9, 8.25]),  # 1.27x every round
        "v-same": rounds_of([101, 79, 90], [10, 12, 11]),
        "v-impossible": rounds_of([150, 124, 140], [7, 8, 7]),
    }
    result = synthetic_result(per_round)
    assert set(result["comparison"]) == {"v", "v-same", "v-impossible"}
    v = result["comparison"]["v"]
    assert v["output_throughput_speedup"] == pytest.approx(1.27)
    assert v["output_throughput_speedup_ci95"] == pytest.approx([1.27, 1.27])
    assert v["fraction_of_ideal_speedup_ci95"] == pytest.approx([1.27 * 0.75, 1.27 * 0.75])
    assert v["ratios_ci95"]["mean_tpot_ms"] == pytest.approx([0.75, 0.75]) and v["verdict"] is None
    assert result["comparison"]["v-same"]["verdict"] == "no measurable change"
    assert result["comparison"]["v-impossible"]["verdict"].startswith("measurement problem")
    aa = result["aa"]
    assert aa["output_throughput_ratio"] == pytest.approx((101 / 100 * 79 / 80 * 91 / 90) ** (1 / 3))
    low, high = aa["output_throughput_ratio_ci95"]
    assert low < 1 < high and aa["holds_1"]
    assert aa["mean_tpot_ms_ratio_ci95"] == pytest.approx([1.0, 1.0])
    assert result["rounds"] == 3

    table = markdown_report(result)
    assert "| v | 1.333 | 1.27x [1.27, 1.27] | 0.95 [0.95, 0.95] |" in table
    assert "| v-same | 1.333 | no measurable change (1.00x [" in table
    impossible_row = [line for line in table.splitlines() if line.startswith("| v-impossible |")][-1]
    assert "measurement problem" in impossible_row and "x [" not in impossible_row
    assert "| dense (A/A: noise floor) | 1.000 | 1.00x [" in table
    assert "3 rounds; headline `output_throughput` precision ±2.0% (target ±3.0%): done." in table


def test_stop_rule_stops_when_precise_or_out_of_rounds():
    # Two arms: blocks of 2 rounds, so --rounds 3 means 4 and no stop falls inside a block.
    config = LoadConfig(rounds=3, max_rounds=6, target_precision=0.05)
    precise = StopRule(config, "dense", "output_throughput", deadline=math.inf)
    for rounds in (2, 3):
        dense, variant = rounds_of([100] * rounds, [10] * rounds), rounds_of([130] * rounds, [8] * rounds)
        steady = {"dense": dense, "v": variant}
        assert precise(steady) is None  # below the fewest rounds (3 rounded up to a block)
    steady = {"dense": rounds_of([100] * 4, [10] * 4), "v": rounds_of([130] * 4, [8] * 4)}
    assert precise(steady) == "target precision ±5.0% reached"
    assert precise.record()["reached"] == pytest.approx(0.0)
    assert precise.record()["order"] == {"design": "williams", "block_rounds": 2, "arms": []}

    noisy = StopRule(config, "dense", "output_throughput", deadline=math.inf)
    wild = [100, 150, 80, 130, 70, 160]
    per_round = {"dense": rounds_of([100] * 5, [10] * 5), "v": rounds_of(wild[:5], [8] * 5)}
    assert noisy(per_round) is None
    per_round = {"dense": rounds_of([100] * 6, [10] * 6), "v": rounds_of(wild, [8] * 6)}
    assert noisy(per_round) == "--max-rounds 6 reached" and noisy.record()["reached"] > 0.05
    late = StopRule(config, "dense", "output_throughput", deadline=0.0)
    per_round = {"dense": rounds_of([100] * 5, [10] * 5), "v": rounds_of(wild[:5], [8] * 5)}
    assert late(per_round) is None  # the budget is spent, but the block is not whole
    per_round = {"dense": rounds_of([100] * 4, [10] * 4), "v": rounds_of(wild[:4], [8] * 4)}
    assert late(per_round).startswith("--time-budget")


def test_a_budget_that_cuts_blocks_stops_inside_one_once_the_fewest_rounds_ran():
    """Issue 57, 7: the demo's load test ran a whole block of 6 rounds past its 150 s budget (4:20)."""
    config = LoadConfig(rounds=2, max_rounds=20, target_precision=0.001, budget_cuts_blocks=True)
    rule = StopRule(config, "dense", "output_throughput", deadline=0.0)
    wild = [100, 150, 80, 130]

    def arms(rounds):
        return {name: rounds_of(wild[:rounds], [10] * rounds) for name in ("dense", "dense (A/A)", "v")}

    assert rule(arms(1)) is None  # the fewest rounds run whatever the time
    assert rule(arms(2)) == (
        "--time-budget 600 s spent after 2 rounds (inside a block of 6: the order is balanced over whole "
        "blocks only)"
    )
    patient = StopRule(replace(config, budget_cuts_blocks=False), "dense", "output_throughput", deadline=0.0)
    assert patient(arms(2)) is None  # without it, the budget waits for the block's end


def test_stop_rule_with_three_arms_stops_only_after_whole_blocks_of_six():
    config = LoadConfig(rounds=3, max_rounds=20, target_precision=0.05)
    rule = StopRule(config, "dense", "output_throughput", deadline=0.0)

    def arms(rounds):
        return {name: rounds_of([100] * rounds, [10] * rounds) for name in ("dense", "dense (A/A)", "v")}

    assert [rule(arms(rounds)) for rounds in range(1, 6)] == [None] * 5  # precise, but mid-block
    assert rule(arms(6)) == "target precision ±5.0% reached"
    noisy = StopRule(config, "dense", "output_throughput", deadline=math.inf)
    wild = [100, 150, 80, 130, 70, 160] * 4
    per_round = {
        "dense": rounds_of([100] * 18, [10] * 18),
        "dense (A/A)": rounds_of(wild[:18], [10] * 18),
        "v": rounds_of(wild[:18], [8] * 18),
    }
    # --max-rounds 20 is cut to 18, the last whole block.
    assert noisy(per_round) == "--max-rounds 20 reached (18 rounds: whole blocks of 6)"


def test_decision_rule_stops_once_variants_exclude_1_and_aa_is_within_tolerance():
    # Three arms: blocks of 6 rounds. Precision 1 % is out of reach of these rounds; the decision is not.
    config = LoadConfig(
        rounds=3, max_rounds=24, target_precision=0.01, stop_rule="decision", aa_tolerance=0.05
    )
    rule = StopRule(config, "dense", "output_throughput", math.inf, arms=("dense", "v", "dense (A/A)"),
                    aa_arm="dense (A/A)")  # fmt: skip
    jitter = [1.0, 1.02, 0.98, 1.01, 0.99, 1.0] * 4

    def per_round(rounds, aa_jitter, speedup=1.3):
        return {
            "dense": rounds_of([100] * rounds, [10] * rounds),
            "v": rounds_of([100 * speedup * j for j in jitter[:rounds]], [8] * rounds),
            "dense (A/A)": rounds_of([100 * j for j in aa_jitter[:rounds]], [10] * rounds),
        }

    assert rule(per_round(5, jitter)) is None  # mid-block
    assert rule(per_round(6, jitter)).startswith("decided: every variant's interval excludes 1")
    assert rule.record()["rule"] == "decision"
    wide_aa = [1.0, 1.2, 0.85, 1.15, 0.9, 1.1] * 4  # the A/A interval reaches beyond ±5 %
    undecided = StopRule(config, "dense", "output_throughput", math.inf, aa_arm="dense (A/A)")
    assert undecided(per_round(6, wide_aa)) is None
    same = StopRule(config, "dense", "output_throughput", math.inf, aa_arm="dense (A/A)")
    assert same(per_round(6, jitter, speedup=1.0)) is None  # a variant whose interval holds 1: go on
    precision_only = StopRule(LoadConfig(rounds=3, max_rounds=24, target_precision=0.01), "dense",
                              "output_throughput", math.inf, aa_arm="dense (A/A)")  # fmt: skip
    assert precision_only(per_round(6, jitter)) is None
    with pytest.raises(UserError, match="--stop-rule"):
        LoadConfig(stop_rule="soon")


# --- prompts per arm -------------------------------------------------------------------------------------


@pytest.mark.parametrize("source", ["synthetic", "pydoc"])
def test_every_arm_and_round_gets_its_own_prompts_of_equal_length(source):
    config = LoadConfig(num_prompts=4, input_len=24, prompts=source)
    plan = RoundPromptPlan(config, WordTokenizer(), ["dense", "v", "dense (A/A)"])
    first, second = plan.of_round("s", 0), plan.of_round("s", 1)
    texts = [p.text for prompts in (*first.values(), *second.values()) for p in prompts]
    assert len(set(texts)) == len(texts) == 24
    # Distinct starts: no two requests share a first KV block (the tag opens every prompt).
    assert len({text.split()[0] for text in texts}) == 24
    lengths = {arm: [p.estimated_len for p in prompts] for arm, prompts in first.items()}
    assert lengths["dense"] == lengths["v"] == lengths["dense (A/A)"]
    assert all(length <= 24 for length in lengths["dense"])
    if source == "pydoc":
        assert len(build_prompts("pydoc", 3, 200, WordTokenizer())[0].text.split()) > 20


# --- the whole path against fake vLLM servers ------------------------------------------------------------


@pytest.fixture(scope="module")
def fake_servers():
    servers = {name: serve_in_thread(create_fake_app(name), free_port()) for name in ("dense", "v")}
    yield {name: server.url for name, server in servers.items()}
    for server in servers.values():
        server.stop()


def test_aa_run_end_to_end(fake_servers, tmp_path):
    code, out, err = run_cli(
        "loadtest",
        "--target",
        fake_servers["dense"],
        "--models",
        f"dense,v@{fake_servers['v']}",
        "--aa",
        "--blocks",
        "dense=16:0,v=16:4",
        "--num-prompts",
        "4",
        "--input-len",
        "8",
        "--output-len",
        "4",
        "--rounds",
        "2",
        "--max-rounds",
        "3",
        "--target-precision",
        "0.9",
        "--prompts",
        "pydoc",
        "--no-save-registry",
        "--report-dir",
        str(tmp_path / "report"),
        "--json",
    )
    assert code == 0, err
    result = json.loads(out)
    assert list(result["models"]) == ["dense", "v", "dense (A/A)"]
    assert result["targets"]["dense (A/A)"] == fake_servers["dense"]
    # The A/A arm asked the baseline's server for the baseline model: the fake names the model it served.
    assert result["models"]["dense (A/A)"]["completed"] == 4 * result["rounds"]
    assert 2 <= result["rounds"] <= 3 and result["precision"]["stop_reason"]
    aa = result["aa"]
    for key in ("output_throughput", "mean_ttft_ms", "mean_tpot_ms", "mean_itl_ms", "mean_e2el_ms"):
        low, high = aa[f"{key}_ratio_ci95"]
        assert low <= aa[f"{key}_ratio"] <= high
    comparison = result["comparison"]["v"]
    low, high = comparison["output_throughput_speedup_ci95"]
    assert low <= comparison["output_throughput_speedup"] <= high
    assert comparison["fraction_of_ideal_speedup_ci95"] == pytest.approx([low * 0.75, high * 0.75])
    assert set(comparison["ratios_ci95"]) == set(comparison["ratios"])
    steady = result["steady"]
    assert 0 < steady["rate"] and steady["precision"]["headline"] == "mean_tpot_ms"
    assert steady["comparison"]["v"]["ratios_ci95"]["mean_tpot_ms"] is not None and "aa" in steady
    report = (tmp_path / "report" / "loadtest.md").read_text()
    assert "A/A: noise floor" in report and "Steady state: Poisson arrivals" in report


@pytest.mark.parametrize(
    "args, message",
    [
        (["--rounds", "5", "--max-rounds", "3"], "--max-rounds must be in --rounds (5)..200"),
        (["--target-precision", "1.5"], "--target-precision must be in [0, 1)"),
        (["--time-budget", "0"], "--time-budget must be positive"),
        (["--steady-fraction", "1"], "--steady-fraction must be in [0, 1)"),
    ],
)
def test_bad_precision_options_are_one_line(args, message):
    code, _, err = run_cli("loadtest", "--target", f"http://127.0.0.1:{free_port()}", *args)
    assert code == 2 and err.startswith("error: ") and message in err and err.count("\n") == 1


@pytest.mark.parametrize("gap", [0.0, 2.0])
def test_the_pause_between_arms_comes_only_after_another_model(monkeypatch, gap):
    """``--arm-gap``: a pause before a round's first run and before each run whose predecessor sent another
    model, never between dense and its A/A arm (one engine), and always before the settling requests."""
    import asyncio

    import loadtest.runner as runner
    from loadtest.order import round_order

    events = []

    async def sleep(seconds):
        events.append(("pause", seconds))

    async def settle(client, target, model, prompts, config):
        events.append(("settle", model))

    async def timed_run(client, target, model, prompts, config, **kwargs):
        events.append(("run", model))
        return RunResult(model=model, round=kwargs["round_index"], rate=math.inf, duration_s=1.0, requests=[])

    monkeypatch.setattr(runner, "pause_between_arms", sleep)
    monkeypatch.setattr(runner, "settle", settle)
    monkeypatch.setattr(runner, "timed_run", timed_run)
    arms = ["dense", "dense (A/A)", "v1", "v2"]
    names = {"dense (A/A)": "dense"}
    config = LoadConfig(arm_gap_s=gap, settle_requests=1)
    for round_index in range(4):
        events.clear()
        targets = {arm: "http://gateway" for arm in arms}
        asyncio.run(runner.run_round(None, targets, [], config, round_index, model_names=names))
        models = [names.get(arm, arm) for arm in round_order(arms, round_index)]
        expected = []
        for index, model in enumerate(models):
            if gap and (index == 0 or models[index - 1] != model):
                expected.append(("pause", gap))
            expected += [("settle", model), ("run", model)]
        assert events == expected
        pauses = sum(event[0] == "pause" for event in events)
        assert pauses == (0 if not gap else 1 + sum(a != b for a, b in zip(models, models[1:])))
    with pytest.raises(UserError, match="--arm-gap"):
        LoadConfig(arm_gap_s=-1)
