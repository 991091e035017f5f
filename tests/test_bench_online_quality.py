"""benchmarks.bench_online_quality (issue 53 item 6): its readings on synthetic data (first decided look,
the shadow's cost from ABBA blocks with its same-phase control, online order against offline order), and
``--smoke``: the whole protocol against fake vLLM backends, where another model's tokens cost 1 nat."""

from __future__ import annotations

import json
import math

import pytest

from benchmarks.bench_online_quality import OnlineQualityConfig, parse_args, run
from benchmarks.online_quality_reading import (
    abba_phases,
    first_decisions,
    markdown,
    order_comparison,
    phase_cost,
)


def test_blocks_run_in_abba_order_so_drift_falls_on_both_phases():
    assert abba_phases(3) == ["off", "on", "on", "off", "off", "on"]


def verdicts(*pairs: tuple[str, str]) -> list[dict]:
    """Looks 10 scored requests apart whose ``v`` arm says (quality, speed)."""
    return [
        {"look": k + 1, "scored": {"v": 10 * (k + 1)}, "answered": {"v": 12 * (k + 1)},
         "arms": {"v": {"quality": quality, "speed": speed}}}
        for k, (quality, speed) in enumerate(pairs)
    ]  # fmt: skip


def test_the_first_decided_look_and_the_requests_it_took():
    looks = verdicts(
        ("undecided", "undecided"), ("undecided", "faster"), ("worse", "faster"), ("worse", "faster")
    )
    decided = first_decisions(looks, "v")
    assert decided["quality"] == {
        "verdict": "worse",
        "look": 3,
        "requests": 30,
        "final": "worse",
        "changed": False,
    }
    assert decided["speed"] == {
        "verdict": "faster",
        "look": 2,
        "requests": 24,
        "final": "faster",
        "changed": False,
    }


def test_a_verdict_never_reached_or_later_undone_is_said_so():
    looks = verdicts(("not_worse", "undecided"), ("undecided", "undecided"))
    decided = first_decisions(looks, "v")
    assert decided["quality"]["changed"] and decided["quality"]["final"] == "undecided"
    assert decided["speed"] == {"verdict": "undecided", "look": None, "requests": None, "final": "undecided",
                                "changed": False}  # fmt: skip


def block(phase: str, mean: float) -> dict:
    count = 20
    return {"phase": phase, "moments": {"dense": {"tpot": {"count": count, "total": count * mean,
                                                           "squares": count * mean * mean}}}}  # fmt: skip


def test_the_shadow_cost_is_on_over_off_in_adjacent_pairs_and_same_phase_pairs_hold_one():
    # a machine slowing 2 % per block, the shadow adding 10 %: ABBA pairs cancel the drift
    phases = abba_phases(6)
    blocks = [
        block(phase, 0.1 * 1.02**index * (1.10 if phase == "on" else 1.0))
        for index, phase in enumerate(phases)
    ]
    cost = phase_cost(blocks, "dense")
    assert cost["on_over_off"]["pairs"] == 6 and cost["same_phase"]["pairs"] == 5
    low, high = cost["on_over_off"]["ci95"]
    assert low < 1.10 < high and math.isclose(cost["on_over_off"]["point"], 1.10, rel_tol=0.01)
    assert math.isclose(cost["same_phase"]["point"], 1.02, rel_tol=1e-6)  # the drift, one block apart


def test_blocks_without_the_arm_are_left_out():
    blocks = [block("off", 0.1), {"phase": "on", "moments": {}}, block("on", 0.11), block("off", 0.1)]
    assert phase_cost(blocks, "dense")["on_over_off"]["pairs"] == 1


def test_online_order_against_offline_order():
    online = {
        "aa": {"nll_delta": 0.0, "nll_delta_cs95": [-0.1, 0.1]},
        "patch": {"nll_delta": 0.5, "nll_delta_cs95": [0.4, 0.6]},
        "ppl": {"nll_delta": 0.55, "nll_delta_cs95": [0.45, 0.65]},
        "ce": {"nll_delta": 1.2, "nll_delta_cs95": [1.0, 1.4]},
    }
    offline = {
        "aa": {"retention": 100.0, "retention_ci95": [100.0, 100.0]},
        "patch": {"retention": 52.0, "retention_ci95": [50.0, 54.0]},
        "ppl": {"retention": 28.0, "retention_ci95": [26.0, 29.0]},
        "ce": {"retention": 29.0, "retention_ci95": [27.0, 31.0]},
    }
    compared = order_comparison(online, offline)
    assert compared["online_order"] == ["aa", "patch", "ppl", "ce"]
    assert compared["offline_order"] == ["aa", "patch", "ce", "ppl"] and not compared["same_order"]
    judged = {tuple(pair["arms"]): pair["judged"] for pair in compared["pairs"]}
    assert judged[("aa", "ce")] == "agree"
    assert judged[("patch", "ppl")] == "unresolved"  # the online sequences overlap
    assert judged[("ppl", "ce")] == "unresolved"  # the offline intervals overlap
    offline["ce"] = {"retention": 40.0, "retention_ci95": [38.0, 42.0]}
    assert {tuple(p["arms"]): p["judged"] for p in order_comparison(online, offline)["pairs"]}[
        ("ppl", "ce")
    ] == ("disagree")


def test_the_command_line_makes_the_config():
    config, render = parse_args(["--home", "/tmp/h", "--domains", "gcide", "--blocks", "4"])
    assert render is None and config.domains == ("gcide",) and config.blocks == 4
    assert parse_args(["--render", "r.json"]) == (None, parse_args(["--render", "r.json"])[1])
    with pytest.raises(SystemExit):
        OnlineQualityConfig()  # a real run needs a demo home


def test_smoke_runs_the_protocol_against_fake_backends(tmp_path):
    out = tmp_path / "record.json"
    record = run(OnlineQualityConfig(smoke=True, out=out), "smoke")
    assert json.loads(out.read_text())["benchmark"] == "benchmarks.bench_online_quality"
    assert record["failures"] == []
    result = record["domains"]["pydoc"]
    assert [look["look"] for look in result["looks"]] == [1, 2]
    arms = {arm["name"]: arm for arm in result["final"]["arms"]}
    assert {name: arm["shadow_scored"] for name, arm in arms.items()} == {
        name: 30 for name in OnlineQualityConfig(smoke=True).arms
    }
    twin = arms["dense-aa"]["vs_control"]
    assert twin["nll_delta_cs95"][0] <= 0 <= twin["nll_delta_cs95"][1]
    for name in ("ppl-best", "ce-best", "ppl-best+patch"):  # the fake's other-model penalty: 1 nat per token
        assert math.isclose(arms[name]["vs_control"]["nll_delta"], 1.0, abs_tol=0.15)
        assert result["first_decisions"][name]["quality"]["verdict"] == "worse"
        assert result["first_decisions"][name]["quality"]["requests"] == 30
    assert [block["phase"] for block in record["blocks"]] == abba_phases(2)
    assert record["shadow_cost"]["dense"]["tpot"]["on_over_off"]["pairs"] == 2
    tables = markdown(record)
    assert "| pydoc | ppl-best | 30 |" in tables and "worse at n = 30" in tables
