"""``benchmarks.bench_draft_study``: a draft's row holds its measured alpha, cost and speed-up, and the
projection from them (Leviathan et al.), read from one load-test result."""

import pytest

from benchmarks.bench_draft_study import Draft, draft_rows, markdown, plain_drafts, sessions
from benchmarks.bench_speculative import leviathan


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
    assert by_arm["spec-kl-m8"]["projection_measured_cost"] == pytest.approx(leviathan(0.6, 3, 0.75))
    assert by_arm["spec-kl-m8"]["projection_block_cost"] == pytest.approx(leviathan(0.6, 3, 22 / 30))
    assert by_arm["spec-kl-m15"]["acceptance_rate"] is None  # no counters: no projection, said as such
    assert by_arm["spec-kl-m15"]["projection_measured_cost"] is None
    control = {"output_throughput_ratio": 1.01, "output_throughput_ratio_ci95": [0.97, 1.05]}
    table = markdown(rows, {"drafting-1, 1 in flight": control})
    assert "| perplexity | 8 | 1 | 0.500 | 2.50 | 0.75 [0.70, 0.80] |" in table
    assert "0.70x [0.60, 0.80]" in table
    assert "| kl | 15 | 1 | – | – | 0.50 [0.45, 0.55] | – | – | 0.90x [0.80, 1.00] |" in table
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
