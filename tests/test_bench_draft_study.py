"""``benchmarks.bench_draft_study``: a draft's row holds its measured acceptance (vLLM's rate and accepted
length, and Leviathan et al.'s per-token α from the length), cost and speed-up, and the projection from them,
read from one load-test result."""

import pytest

from benchmarks.bench_draft_study import Draft, draft_rows, markdown, plain_drafts, sessions
from loadtest.acceptance import accepted_length, token_alpha


def comparison(speedup: float, tpot_ratio: float) -> dict:
    return {
        "output_throughput_speedup": speedup,
        "output_throughput_speedup_ci95": [speedup - 0.1, speedup + 0.1],
        "ratios": {"mean_tpot_ms": tpot_ratio},
        "ratios_ci95": {"mean_tpot_ms": [tpot_ratio - 0.05, tpot_ratio + 0.05]},
    }


def test_each_draft_takes_the_cost_of_the_plain_draft_of_its_depth():
    drafts = [
        Draft("kl", 8, "kl8", [1], 30),
        Draft("perplexity", 8, "ppl8", [2], 30),
        Draft("kl", 15, "kl15", [3], 30),
    ]
    plain = plain_drafts(drafts)
    assert plain == {8: "kl8", 15: "kl15"}
    result = {
        "comparison": {
            "kl8": comparison(1.3, 0.75),
            "kl15": comparison(1.9, 0.5),
            "spec-kl-m8": comparison(0.8, 1.2),
            "spec-perplexity-m8": comparison(0.7, 1.3),
            "spec-kl-m15": comparison(0.9, 1.1),
        },
        "speculative": {
            "spec-kl-m8": {"acceptance_rate": 0.6, "mean_accepted_length": 2.8},
            "spec-perplexity-m8": {"acceptance_rate": 0.5, "mean_accepted_length": 2.5},
        },
    }
    rows = draft_rows(result, drafts, plain, k=3, concurrency=1)
    by_arm = {row["arm"]: row for row in rows}
    assert by_arm["spec-perplexity-m8"]["draft_cost"] == 0.75  # kl8's: the same depth
    assert by_arm["spec-kl-m15"]["draft_cost"] == 0.5
    kl8 = by_arm["spec-kl-m8"]
    # the rate 0.6 is not the formula's α: the α whose expected accepted length is the measured 2.8 is
    assert kl8["alpha_token"] == pytest.approx(token_alpha(2.8, 3)) and kl8["alpha_token"] > 0.75
    assert accepted_length(kl8["alpha_token"], 3) == pytest.approx(1 + 3 * kl8["acceptance_rate"])
    assert kl8["projection_measured_cost"] == pytest.approx(2.8 / (3 * 0.75 + 1))
    assert kl8["projection_block_cost"] == pytest.approx(2.8 / (3 * 22 / 30 + 1))
    assert kl8["projection_measured_cost_ci95"] == pytest.approx([2.8 / (3 * 0.8 + 1), 2.8 / (3 * 0.7 + 1)])
    # projected 0.82x–0.90x (c's interval), measured 0.70x–0.90x: the two meet
    assert kl8["projection_meets_measurement"] is True
    assert by_arm["spec-kl-m15"]["acceptance_rate"] is None  # no counters: no projection, said as such
    assert by_arm["spec-kl-m15"]["projection_measured_cost"] is None
    control = {"output_throughput_ratio": 1.01, "output_throughput_ratio_ci95": [0.97, 1.05]}
    table = markdown(rows, {"drafting-1, 1 in flight": control})
    assert "| perplexity | 8 | 1 | 0.500 | 2.50 | 0.691 | 0.75 [0.70, 0.80] |" in table
    assert "0.70x [0.60, 0.80]" in table
    assert "| kl | 15 | 1 | – | – | – | 0.50 [0.45, 0.55] | – | – | 0.90x [0.80, 1.00] |" in table
    assert "A/A control (drafting-1, 1 in flight): 1.01x [0.97, 1.05]" in table


def test_gateways_hold_dense_and_at_most_two_more_engines():
    drafts = [
        Draft(objective, m, f"{objective}{m}", [], 30) for objective in ("kl", "ppl", "ce") for m in (8, 15)
    ]
    planned = sessions(drafts)
    assert [(s.label, s.arms) for s in planned] == [
        ("alone-1", ["dense", "kl8", "kl15"]),
        ("drafting-1", ["dense", "spec-kl-m8", "spec-kl-m15"]),
        ("drafting-2", ["dense", "spec-ppl-m8", "spec-ppl-m15"]),
        ("drafting-3", ["dense", "spec-ce-m8", "spec-ce-m15"]),
    ]


def test_the_per_token_alpha_inverts_the_expected_accepted_length():
    from loadtest.acceptance import alpha_for_speedup, projected_speedup, rate_from_length

    for alpha in (0.0, 0.3, 0.6, 0.9, 1.0):
        assert token_alpha(accepted_length(alpha, 3), 3) == pytest.approx(alpha, abs=1e-9)
    assert token_alpha(2.174, 3) == pytest.approx(0.5994, abs=1e-4)  # vLLM's rate 0.391 at K = 3
    assert rate_from_length(2.173, 3) == pytest.approx(0.391)
    # break-even and 1.2x at half the depth, K = 3: 2.5 and 3.0 tokens per step
    assert alpha_for_speedup(1.0, 3, 0.5) == pytest.approx(token_alpha(2.5, 3))
    assert projected_speedup(alpha_for_speedup(1.2, 3, 0.5), 3, 0.5) == pytest.approx(1.2)
    assert alpha_for_speedup(2.0, 3, 0.5) == 1.0  # out of reach at K = 3


def test_the_committed_draft_study_rows_are_consistent_by_the_formula():
    """Issue 55 item 5: every committed row carries the rate, the accepted length, K and α per token, with
    accepted length = 1 + K · rate (vLLM's) = (1 − α^(K+1)) / (1 − α) (Leviathan et al.'s)."""
    import json
    from pathlib import Path

    study = json.loads((Path(__file__).parent.parent / "docs/draft-study/draft-study.json").read_text())
    for row in study["rows"]:
        length, k = row["mean_accepted_length"], row["k"]
        assert length == pytest.approx(1 + k * row["acceptance_rate"])
        assert accepted_length(row["alpha_token"], k) == pytest.approx(length)
        assert row["projection_measured_cost"] == pytest.approx(length / (k * row["draft_cost"] + 1))
