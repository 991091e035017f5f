"""Every arm of an experiment against its control, from the arms' sufficient statistics.

One function for every reader: the report (statistics of several gateways added up), the gateway's
guardrails and its page (its own). Quality comes from shadow scoring (:mod:`server.shadow`): ``nll_delta``
is the arm's mean ``dense_nll`` minus the control's, ``agreement_delta`` the same for ``top1_agreement``;
speed from the latencies the gateway measured: ``tpot_ratio`` and ``e2el_ratio`` are the arm's mean over the
control's. Each comes with its 95 % confidence sequence (:mod:`server.sequential`), valid at every look, and
the verdicts are read off the sequences.
"""

from __future__ import annotations

from typing import Any

from server.sequential import (
    QUALITY_MARGIN,
    Moments,
    Sequence,
    difference_sequence,
    mean_sequence,
    quality_verdict,
    ratio_sequence,
    speed_verdict,
)

MEASURES = ("dense_nll", "top1_agreement", "tpot", "e2el")
"""The per-request streams an arm has: two shadow scores and two latencies."""


def _shown(sequence: Sequence) -> tuple[float | None, list[float] | None]:
    return sequence.estimate, sequence.bounds()


def arm_quality(measures: dict[str, Moments]) -> dict[str, Any]:
    """An arm's own shadow scores, each with its confidence sequence."""
    row: dict[str, Any] = {}
    for measure in ("dense_nll", "top1_agreement"):
        row[measure], row[f"{measure}_cs95"] = _shown(mean_sequence(measures.get(measure, Moments())))
    return row


def versus_control(
    arm: dict[str, Moments], control: dict[str, Moments], margin: float = QUALITY_MARGIN
) -> dict[str, Any]:
    """One arm against the control: the four comparisons, their sequences and the two verdicts."""
    empty = Moments()
    nll = difference_sequence(arm.get("dense_nll", empty), control.get("dense_nll", empty))
    agreement = difference_sequence(arm.get("top1_agreement", empty), control.get("top1_agreement", empty))
    tpot = ratio_sequence(arm.get("tpot", empty), control.get("tpot", empty))
    e2el = ratio_sequence(arm.get("e2el", empty), control.get("e2el", empty))
    row: dict[str, Any] = {}
    for name, sequence in (
        ("nll_delta", nll),
        ("agreement_delta", agreement),
        ("tpot_ratio", tpot),
        ("e2el_ratio", e2el),
    ):
        row[name], row[f"{name}_cs95"] = _shown(sequence)
    row["quality"] = quality_verdict(nll, margin)
    row["speed"] = speed_verdict(tpot)
    return row


def compare_arms(
    moments: dict[str, dict[str, Moments]], arms: list[str], control: str, margin: float = QUALITY_MARGIN
) -> dict[str, dict[str, Any]]:
    """Per arm (in ``arms`` order): its shadow scores, and for every arm but the control ``vs_control``."""
    control_moments = moments.get(control, {})
    rows = {}
    for arm in arms:
        row = arm_quality(moments.get(arm, {}))
        if arm != control:
            row["vs_control"] = versus_control(moments.get(arm, {}), control_moments, margin)
        rows[arm] = row
    return rows


def ideal_tpot_ratio(arm_facts: dict, control_facts: dict) -> float | None:
    """The lowest TPOT ratio depth pruning can give: the arm's blocks over the control's (N − M over N
    against dense), when both say how many blocks they have of the same total; None when either does not."""
    blocks = arm_facts.get("num_blocks")
    if not blocks or blocks != control_facts.get("num_blocks"):
        return None
    kept = blocks - len(arm_facts.get("removed_blocks") or [])
    control_kept = blocks - len(control_facts.get("removed_blocks") or [])
    return kept / control_kept if control_kept else None


def against_ideal(arm_facts: dict, control_facts: dict, versus: dict[str, Any]) -> dict[str, Any]:
    """``ideal_tpot_ratio`` and ``beyond_ideal`` of an arm whose comparison with the control is ``versus``."""
    ideal = ideal_tpot_ratio(arm_facts, control_facts)
    return {"ideal_tpot_ratio": ideal, "beyond_ideal": beyond_ideal(versus, ideal)}


def beyond_ideal(versus: dict[str, Any], ideal: float | None) -> bool:
    """Whether the arm's TPOT ratio lies wholly below what removing its blocks can give: a measurement
    artefact until explained (the control's engine slowed by shadow scoring, a shared machine), not a gain."""
    bounds = versus.get("tpot_ratio_cs95")
    return ideal is not None and bounds is not None and bounds[1] < ideal
