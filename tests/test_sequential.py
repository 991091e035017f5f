"""Confidence sequences (server.sequential): valid at every look where a fixed-horizon interval is not.

The simulation is issue 53's: 1,000 A/A experiments, each looked at 50 times as its two arms grow to 1,000
observations, for the three kinds of streams an experiment has (per-request NLL, top-1 agreement in [0, 1],
latencies for a ratio). A false decision is any look at which the sequence excludes "no change" (0 for a
difference, 1 for a ratio): stricter than the verdicts, which need the whole sequence past a margin.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from server.experiment_comparison import compare_arms, versus_control
from server.sequential import (
    MIN_DECISION_COUNT,
    Moments,
    difference_sequence,
    mean_sequence,
    quality_verdict,
    radius,
    ratio_sequence,
    rho_squared,
    speed_verdict,
)

STREAMS, LENGTH, LOOKS = 1_000, 1_000, 50


def _moments(values: np.ndarray) -> np.ndarray:
    """Per row: count, sum and sum of squares."""
    return np.stack([np.full(len(values), values.shape[1]), values.sum(1), (values**2).sum(1)], 1)


def _false_decision_rates(draw, ratio: bool) -> tuple[float, float]:
    """(sequence, fixed-horizon) share of A/A streams declared different at any of the looks."""
    arm, control = draw((STREAMS, LENGTH)), draw((STREAMS, LENGTH))
    looks = np.linspace(LENGTH / LOOKS, LENGTH, LOOKS).astype(int)
    by_sequence = np.zeros(STREAMS, bool)
    by_z = np.zeros(STREAMS, bool)
    for n in looks:
        arm_moments = _moments(arm[:, :n])
        control_moments = _moments(control[:, :n])
        for stream in range(STREAMS):
            a, c = Moments(*arm_moments[stream]), Moments(*control_moments[stream])
            sequence = (ratio_sequence if ratio else difference_sequence)(a, c)
            null = 1.0 if ratio else 0.0
            if sequence.decidable and not sequence.low <= null <= sequence.high:
                by_sequence[stream] = True
            if ratio:
                estimate = math.log(a.mean / c.mean)
                se = math.sqrt(a.variance / a.mean**2 / n + c.variance / c.mean**2 / n)
            else:
                estimate = a.mean - c.mean
                se = math.sqrt(a.variance / n + c.variance / n)
            if abs(estimate) > 1.96 * se:
                by_z[stream] = True
    return by_sequence.mean(), by_z.mean()


@pytest.mark.parametrize(
    "kind, draw, ratio",
    [
        ("nll (gamma)", lambda rng: lambda shape: rng.gamma(2.0, 1.0, shape), False),
        ("agreement (beta)", lambda rng: lambda shape: rng.beta(5.0, 2.0, shape), False),
        ("latency (lognormal)", lambda rng: lambda shape: rng.lognormal(0.0, 0.5, shape), True),
    ],
)
def test_aa_streams_looked_at_50_times_keep_false_decisions_under_5_percent(kind, draw, ratio):
    rng = np.random.default_rng(53)
    sequence_rate, fixed_rate = _false_decision_rates(draw(rng), ratio)
    print(f"{kind}: confidence sequence {sequence_rate:.1%}, fixed-horizon z-interval {fixed_rate:.1%}")
    assert sequence_rate <= 0.05
    assert fixed_rate > 0.15  # the contrast: peeking at a fixed-horizon interval declares A/A differences


def test_sequence_narrows_and_holds_a_real_difference():
    rng = np.random.default_rng(1)
    arm, control = Moments(), Moments()
    widths = []
    for step in range(1, 2001):
        arm, control = arm.add(rng.normal(0.3, 1.0)), control.add(rng.normal(0.0, 1.0))
        if step % 500 == 0:
            sequence = difference_sequence(arm, control)
            widths.append(sequence.high - sequence.low)
    assert widths == sorted(widths, reverse=True)
    assert sequence.low > 0.1 and sequence.high < 0.5
    assert quality_verdict(sequence, margin=0.05) == "worse"
    assert quality_verdict(sequence, margin=0.6) == "not_worse"


def test_no_verdict_before_the_minimum_count():
    arm = Moments(MIN_DECISION_COUNT - 1, 100.0, 400.0)
    control = Moments(500, 0.0, 500.0)
    sequence = difference_sequence(arm, control)
    assert not sequence.decidable and sequence.low is not None
    assert quality_verdict(sequence) == "undecided"
    assert speed_verdict(ratio_sequence(Moments(5, 5, 5.1), Moments(5, 10, 20.2))) == "undecided"


def test_ratio_verdicts_and_edge_cases():
    fast, slow = Moments(), Moments()
    rng = np.random.default_rng(2)
    for _ in range(400):
        fast, slow = fast.add(rng.lognormal(-0.3, 0.2)), slow.add(rng.lognormal(0.0, 0.2))
    assert speed_verdict(ratio_sequence(fast, slow)) == "faster"
    assert speed_verdict(ratio_sequence(slow, fast)) == "slower"
    assert ratio_sequence(Moments(), slow).estimate is None
    assert mean_sequence(Moments(1, 2.0, 4.0)).low is None
    assert radius(0.0, 1.0) == 0.0
    assert 0 < rho_squared() < 1


def test_compare_arms_gives_every_field_of_the_report():
    rng = np.random.default_rng(3)
    streams = {}
    for arm, shift in (("dense", 0.0), ("dense-aa", 0.0), ("pruned", 0.8)):
        measures = {name: Moments() for name in ("dense_nll", "top1_agreement", "tpot", "e2el")}
        for _ in range(200):
            measures["dense_nll"] = measures["dense_nll"].add(rng.gamma(2, 1) + shift)
            measures["top1_agreement"] = measures["top1_agreement"].add(rng.beta(5, 2) - shift / 4)
            measures["tpot"] = measures["tpot"].add(rng.lognormal(-shift / 2, 0.1))
            measures["e2el"] = measures["e2el"].add(rng.lognormal(-shift / 2, 0.1))
        streams[arm] = measures
    rows = compare_arms(streams, ["dense", "dense-aa", "pruned"], "dense", margin=0.05)
    assert "vs_control" not in rows["dense"]
    assert rows["pruned"]["vs_control"]["quality"] == "worse"
    assert rows["pruned"]["vs_control"]["speed"] == "faster"
    assert rows["pruned"]["vs_control"]["nll_delta_cs95"][0] > 0
    low, high = rows["dense-aa"]["vs_control"]["nll_delta_cs95"]
    assert low < 0 < high
    assert set(rows["dense-aa"]["vs_control"]) == {
        "nll_delta",
        "nll_delta_cs95",
        "agreement_delta",
        "agreement_delta_cs95",
        "tpot_ratio",
        "tpot_ratio_cs95",
        "e2el_ratio",
        "e2el_ratio_cs95",
        "quality",
        "speed",
    }
    assert versus_control({}, {})["quality"] == "undecided"
