"""A TPOT ratio below what removing blocks can give is flagged, not reported as a gain (issue 53's reading:
with the control's engine shadow-scoring every arm, the arms' ratios fell below N − M over N)."""

from __future__ import annotations

from rich.console import Console

from server.experiment_comparison import beyond_ideal, ideal_tpot_ratio
from server.experiment_report import print_comparison

DENSE = {"num_blocks": 30, "removed_blocks": []}
PRUNED = {"num_blocks": 30, "removed_blocks": [3, 4, 5, 12, 14, 17, 25, 26]}


def test_the_ideal_is_the_arms_blocks_over_the_controls():
    assert ideal_tpot_ratio(PRUNED, DENSE) == 22 / 30
    assert ideal_tpot_ratio(DENSE, DENSE) == 1.0
    assert ideal_tpot_ratio(PRUNED, {"num_blocks": 30, "removed_blocks": [1, 2]}) == 22 / 28
    assert ideal_tpot_ratio(PRUNED, {"num_blocks": 32, "removed_blocks": []}) is None  # another model
    assert ideal_tpot_ratio({"num_blocks": None, "removed_blocks": None}, DENSE) is None  # a remote backend


def test_only_a_sequence_wholly_below_the_ideal_is_beyond_it():
    ideal = 22 / 30
    assert beyond_ideal({"tpot_ratio_cs95": [0.49, 0.72]}, ideal)
    assert not beyond_ideal({"tpot_ratio_cs95": [0.49, 0.92]}, ideal)  # holds the ideal: could be real
    assert not beyond_ideal({"tpot_ratio_cs95": None}, ideal)
    assert not beyond_ideal({"tpot_ratio_cs95": [0.4, 0.5]}, None)


def _arm(name: str, versus: dict | None) -> dict:
    row = {"name": name, "shadow_scored": 60, "shadow_dropped": 0, "top1_agreement": 0.3}
    row["top1_agreement_cs95"] = [0.2, 0.4]
    if versus is not None:
        row["vs_control"] = versus
    return row


def test_the_report_says_so_and_names_the_shadow_scorings_cost():
    versus = {"nll_delta": 2.8, "nll_delta_cs95": [2.4, 3.3], "quality": "worse", "speed": "faster"}
    versus |= {"tpot_ratio": 0.67, "tpot_ratio_cs95": [0.50, 0.70], "e2el_ratio": 0.7}
    versus |= {"e2el_ratio_cs95": [0.5, 0.9], "ideal_tpot_ratio": 22 / 30, "beyond_ideal": True}
    result = {"control": "dense", "margin": 0.05, "shadow_rate": 1.0}
    result["arms"] = [_arm("dense", None), _arm("ppl-best", versus)]
    console = Console(record=True, width=100)
    print_comparison(result, console)
    text = console.export_text()
    assert "ppl-best: TPOT ratio wholly below 0.733" in text
    assert "shadow_rate 1: the control's engine also scores" in text
    console = Console(record=True, width=100)
    print_comparison({**result, "shadow_rate": 0.0, "arms": [_arm("dense", None)]}, console)
    assert "wholly below" not in console.export_text() and "shadow_rate" not in console.export_text()
