"""The fraction of a parent's perplexity gap to dense that a repaired child recovers, paired over windows."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pruning.evaluation.item_scores import perplexity_statistics
from pruning.evaluation.paired import add_gap_recovered, add_paired, gap_recovered
from pruning.evaluation.report import quality_lines
from pruning.evaluation.results import EvalResult

TOKENS = [100] * 12


def windows(mean_nll: float, spread: float = 0.3, seed: int = 0) -> tuple[list, list]:
    """``(nll, tokens)`` of 12 windows whose mean per-token NLL is about ``mean_nll``."""
    noise = np.random.default_rng(seed).normal(0, spread, len(TOKENS))
    return [float((mean_nll + shift) * tokens) for shift, tokens in zip(noise, TOKENS)], list(TOKENS)


def test_a_child_equal_to_dense_recovers_everything_and_one_equal_to_its_parent_nothing():
    dense, parent = windows(2.0), windows(3.0, seed=1)
    back = gap_recovered(dense, parent, dense)
    assert back["gap_recovered"] == pytest.approx(1.0) and back["gap_recovered_ci95"] == pytest.approx([1, 1])
    none = gap_recovered(dense, parent, parent)
    assert none["gap_recovered"] == pytest.approx(0.0) and none["gap_recovered_ci95"] == pytest.approx([0, 0])


def test_the_fraction_is_the_log_perplexity_ratio_and_its_interval_holds_it():
    dense, parent = windows(2.0), windows(3.0, seed=1)
    child = ([value - 0.4 * 100 for value in parent[0]], parent[1])  # 0.4 nats per token better than parent
    result = gap_recovered(dense, parent, child)
    log = lambda model: sum(model[0]) / sum(model[1])  # noqa: E731
    expected = (log(parent) - log(child)) / (log(parent) - log(dense))
    assert result["gap_recovered"] == pytest.approx(expected)
    low, high = result["gap_recovered_ci95"]
    assert low <= expected <= high and high - low < 0.5
    assert gap_recovered(dense, parent, child) == result  # seeded: the same interval again


def test_no_gap_to_recover_gives_no_fraction():
    dense = windows(2.0)
    assert gap_recovered(dense, dense, windows(2.5, seed=3))["gap_recovered"] is None


def result(task: str, keys: list[str], per_window: tuple[list, list]) -> EvalResult:
    statistics = perplexity_statistics(keys, *per_window)
    return EvalResult("offline", task, "perplexity", math.exp(sum(per_window[0]) / sum(per_window[1])),
                      {"statistics": statistics})  # fmt: skip


def test_eval_pairs_a_child_with_its_parent_on_the_same_windows_in_any_order():
    keys = [f"w{index}" for index in range(12)]
    dense, parent = windows(2.0), windows(3.0, seed=1)
    child = ([value - 50 for value in parent[0]], parent[1])
    reverse = lambda values: list(reversed(values))  # noqa: E731 - the child's windows come back reversed
    base = [result("gcide", keys, dense)]
    parent_results = [result("gcide", keys, parent)]
    child_results = [result("gcide", reverse(keys), (reverse(child[0]), reverse(child[1])))]
    for results in (parent_results, child_results):
        add_paired("dense", base, results)
    add_gap_recovered(base, parent_results, child_results)
    paired = child_results[0].settings["statistics"]["paired"]
    assert paired["gap_recovered"] == pytest.approx(gap_recovered(dense, parent, child)["gap_recovered"])
    assert "gap_recovered" not in parent_results[0].settings["statistics"]["paired"]
    record = {"task": "gcide", "metric": "perplexity", "n": 12, "perplexity": 10.0, **paired}
    lines = quality_lines([{"label": "child", "baseline": False, "tasks": {"gcide": record}}])
    shown = f"gcide {paired['gap_recovered']:.3f} [{paired['gap_recovered_ci95'][0]:.3f}, "
    assert any("gap to the baseline recovered from its parent" in line and shown in line for line in lines)
