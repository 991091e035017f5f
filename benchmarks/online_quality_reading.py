"""What ``benchmarks.bench_online_quality`` reads from a run: pure functions, no server, no model.

* :func:`first_decisions`: at which look (and after how many scored requests of the arm) each arm's quality
  and speed verdicts were first decided, and whether a later look said otherwise;
* :func:`phase_cost`: the shadow scoring's cost to an arm's TPOT from blocks run shadow-off and shadow-on
  in ABBA order (off, on, on, off, off, on, ...): per adjacent off/on pair the ratio on/off, and, as the A/A
  control of that comparison, per adjacent same-phase pair the ratio later/earlier, each combined with
  :func:`loadtest.intervals.estimate_ratio` (Student's t on the per-pair log-ratios);
* :func:`order_comparison`: the arms ordered online (``nll_delta``, lower is better) and offline (perplexity
  retention, higher is better), and each pair of arms judged ``agree`` / ``disagree`` / ``unresolved``;
* the markdown tables of docs/benchmarks.md (:func:`markdown`), rendered from the JSON record alone.

Used by ``benchmarks.bench_online_quality`` and tested on synthetic data (tests/test_bench_online_quality.py).
"""

from __future__ import annotations

from itertools import combinations
from typing import Any

from loadtest.intervals import estimate_ratio
from server.sequential import Moments

UNDECIDED = "undecided"
PHASES = ("off", "on")


def abba_phases(blocks: int) -> list[str]:
    """The phase of each of ``2 * blocks`` blocks in ABBA order: off, on, on, off, off, on, ...

    Adjacent pairs (0, 1), (2, 3), ... hold one block of each phase, their order alternating, so a linear
    drift of the machine falls on both phases alike; pairs (1, 2), (3, 4), ... hold one phase twice.
    """
    pattern = ("off", "on", "on", "off")
    return [pattern[index % 4] for index in range(2 * blocks)]


# ------------------------------------------------------------------------------ verdicts over looks


def first_decisions(looks: list[dict[str, Any]], arm: str) -> dict[str, dict[str, Any]]:
    """The first look at which each verdict of ``arm`` was decided.

    Args:
        looks: in order, each ``{"look": k, "scored": {arm: shadow-scored requests}, "answered": {arm:
            requests with a TPOT}, "arms": {arm: vs_control}}`` (``vs_control`` as
            :func:`server.experiment_comparison.versus_control` gives it).
        arm: a non-control arm.

    Returns:
        ``{"quality": ..., "speed": ...}``, each ``{"verdict", "look", "requests", "final", "changed"}``:
        the first decided verdict (``undecided`` with ``look`` None if never), the look and the arm's
        requests then (scored for quality, answered for speed), the verdict at the last look, and whether
        any later look gave another verdict.
    """
    decisions = {}
    for kind, counted in (("quality", "scored"), ("speed", "answered")):
        verdicts = [(look, look["arms"].get(arm, {}).get(kind, UNDECIDED)) for look in looks]
        first = next(((look, verdict) for look, verdict in verdicts if verdict != UNDECIDED), None)
        final = verdicts[-1][1] if verdicts else UNDECIDED
        if first is None:
            decisions[kind] = {"verdict": UNDECIDED, "look": None, "requests": None, "final": final}
            decisions[kind]["changed"] = False
            continue
        look, verdict = first
        later = [other for seen, other in verdicts if seen["look"] > look["look"]]
        decisions[kind] = {
            "verdict": verdict,
            "look": look["look"],
            "requests": look[counted].get(arm),
            "final": final,
            "changed": any(other != verdict for other in later),
        }
    return decisions


# ------------------------------------------------------------------------------ the shadow's cost


def block_mean(moments: dict[str, float] | Moments | None) -> float | None:
    """Mean of one block's stream (``{"count", "total", "squares"}`` or :class:`Moments`); None if empty."""
    if moments is None:
        return None
    if isinstance(moments, dict):
        moments = Moments(moments.get("count", 0.0), moments.get("total", 0.0), moments.get("squares", 0.0))
    return moments.mean


def phase_cost(blocks: list[dict[str, Any]], arm: str, measure: str = "tpot") -> dict[str, Any]:
    """The shadow's cost to ``arm``'s ``measure``: on/off over adjacent mixed pairs, and the A/A control.

    Args:
        blocks: in run order, each ``{"phase": "off" | "on", "moments": {arm: {measure: {"count", "total",
            "squares"}}}}`` (the block's own statistics, not cumulative ones).
        arm: whose stream.
        measure: ``tpot`` or ``e2el``.

    Returns:
        ``{"on_over_off": {point, ci95, pairs}, "same_phase": {point, ci95, pairs}}``: the geometric mean of
        the per-pair ratios with its 95 % t-interval; ``same_phase`` (later block over earlier, same phase)
        should hold 1: its interval is the comparison's noise floor.
    """
    means = [block_mean(block["moments"].get(arm, {}).get(measure)) for block in blocks]
    phases = [block["phase"] for block in blocks]
    mixed, same = [], []
    for index in range(len(blocks) - 1):
        first, second = means[index], means[index + 1]
        if not first or not second:
            continue
        if phases[index] != phases[index + 1]:
            if index % 2 == 0:  # disjoint pairs (0, 1), (2, 3), ...
                on, off = (second, first) if phases[index] == "off" else (first, second)
                mixed.append(on / off)
        elif index % 2 == 1:  # (1, 2), (3, 4), ...: one phase twice
            same.append(second / first)
    return {"on_over_off": _ratio(mixed), "same_phase": _ratio(same)}


def _ratio(ratios: list[float]) -> dict[str, Any]:
    estimate = estimate_ratio(ratios)
    return {"point": estimate.point, "ci95": estimate.ci95, "pairs": estimate.rounds}


# ------------------------------------------------------------------------------ online against offline


def _overlap(a: list[float] | None, b: list[float] | None) -> bool:
    return a is None or b is None or not (a[1] < b[0] or b[1] < a[0])


def order_comparison(online: dict[str, dict], offline: dict[str, dict]) -> dict[str, Any]:
    """The arms' online order against their offline order on one task.

    Args:
        online: ``{arm: {"nll_delta", "nll_delta_cs95"}}`` (lower is better; the control's delta is 0).
        offline: ``{arm: {"retention", "retention_ci95"}}`` (percent of dense, higher is better).

    Returns:
        ``online_order`` and ``offline_order`` (best first, by point estimate, arms present in both),
        ``same_order`` (whether they are the same), and ``pairs``: for each pair of arms whose online and
        offline point orders agree or not, ``agree``/``disagree`` when both sides' intervals separate the
        two, ``unresolved`` when either side's intervals overlap (then the point orders prove nothing).
    """
    arms = [arm for arm in online if arm in offline and online[arm].get("nll_delta") is not None]
    online_order = sorted(arms, key=lambda arm: online[arm]["nll_delta"])
    offline_order = sorted(arms, key=lambda arm: -offline[arm]["retention"])
    pairs = []
    for first, second in combinations(online_order, 2):
        online_better = online[first]["nll_delta"] < online[second]["nll_delta"]
        offline_better = offline[first]["retention"] > offline[second]["retention"]
        resolved = not _overlap(online[first].get("nll_delta_cs95"), online[second].get("nll_delta_cs95"))
        resolved = resolved and not _overlap(
            offline[first].get("retention_ci95"), offline[second].get("retention_ci95")
        )
        judged = ("agree" if online_better == offline_better else "disagree") if resolved else "unresolved"
        pairs.append(
            {"arms": [first, second], "points_agree": online_better == offline_better, "judged": judged}
        )
    return {
        "online_order": online_order,
        "offline_order": offline_order,
        "same_order": online_order == offline_order,
        "pairs": pairs,
    }


# ------------------------------------------------------------------------------ docs tables


def _num(value: float | None, digits: int = 3, signed: bool = False) -> str:
    if value is None:
        return "–"
    return f"{value:+.{digits}f}" if signed else f"{value:.{digits}f}"


def _with(value: float | None, bounds: list[float] | None, digits: int = 3, signed: bool = False) -> str:
    shown = _num(value, digits, signed)
    if value is None or bounds is None:
        return shown
    return f"{shown} [{_num(bounds[0], digits, signed)}, {_num(bounds[1], digits, signed)}]"


def _decided(decision: dict | None) -> str:
    if not decision or decision["verdict"] == UNDECIDED:
        final = (decision or {}).get("final", UNDECIDED)
        return UNDECIDED if final == UNDECIDED else f"{final} (last look only)"
    changed = f", later {decision['final']}" if decision.get("changed") else ""
    return f"{decision['verdict']} at n = {decision['requests']}{changed}"


def _table(columns: list[str], rows: list[list[str]]) -> list[str]:
    """A markdown table's lines."""
    cells = [columns, ["---"] * len(columns), *rows]
    return ["| " + " | ".join(row) + " |" for row in cells]


def quality_table(record: dict) -> list[str]:
    """One row per domain and arm: scored, dense NLL, top-1 agreement, the deltas and the verdicts."""
    rows = []
    for domain, result in record["domains"].items():
        for arm in result["final"]["arms"]:
            versus = arm.get("vs_control")
            decisions = result["first_decisions"].get(arm["name"], {})
            row = [domain, arm["name"] + (" (control)" if versus is None else ""), str(arm["shadow_scored"])]
            row += [_with(arm["dense_nll"], arm["dense_nll_cs95"])]
            row += [_with(arm["top1_agreement"], arm["top1_agreement_cs95"])]
            if versus is None:
                row += ["–"] * 4
            else:
                row += [_with(versus["nll_delta"], versus["nll_delta_cs95"], signed=True)]
                row += [_with(versus["agreement_delta"], versus["agreement_delta_cs95"], signed=True)]
                row += [_decided(decisions.get("quality")), _decided(decisions.get("speed"))]
            rows.append(row)
    columns = ["prompts", "arm", "scored", "dense NLL [CS]", "top-1 agreement [CS]", "nll_delta [CS]"]
    columns += ["agreement_delta [CS]", "quality: first decided", "speed: first decided"]
    return _table(columns, rows)


def speed_table(record: dict) -> list[str]:
    """One row per arm: TPOT ratio to the control shadow off and on, and the shadow's cost to its TPOT."""
    off = {arm["name"]: arm for arm in record["off_phase"]["arms"]}
    on = {arm["name"]: arm for arm in next(iter(record["domains"].values()))["final"]["arms"]}
    rows = []
    for name, arm in off.items():
        cost = record["shadow_cost"].get(name, {}).get("tpot", {})
        row = [name + (" (control)" if arm.get("vs_control") is None else "")]
        for versus in (arm.get("vs_control"), on.get(name, {}).get("vs_control")):
            row.append(_with(versus.get("tpot_ratio"), versus.get("tpot_ratio_cs95")) if versus else "1")
        for key in ("on_over_off", "same_phase"):
            estimate = cost.get(key, {})
            row.append(
                f"{_with(estimate.get('point'), estimate.get('ci95'))} ({estimate.get('pairs', 0)} pairs)"
            )
        rows.append(row)
    columns = ["arm", "TPOT / control, shadow off [CS]", "TPOT / control, shadow on [CS]"]
    return _table(columns + ["TPOT on / off [95 %]", "A/A: same phase [95 %]"], rows)


def order_table(record: dict) -> list[str]:
    """Per domain and offline task: the two orders and the pairwise judgements."""
    rows = []
    for domain, result in record["domains"].items():
        for task, comparison in result.get("order", {}).items():
            judged = ", ".join(f"{'/'.join(pair['arms'])}: {pair['judged']}" for pair in comparison["pairs"])
            online, offline = " < ".join(comparison["online_order"]), " > ".join(comparison["offline_order"])
            rows.append([domain, task, online, offline, "yes" if comparison["same_order"] else "no", judged])
    columns = ["online prompts", "offline task", "online order (nll_delta)", "offline order (retention)"]
    return _table(columns + ["same", "pairs"], rows)


def offline_table(record: dict) -> list[str]:
    """The offline yardstick the orders are compared with: perplexity and retention per arm and task."""
    tasks = sorted({task for entry in record["offline"].values() for task in entry})
    rows = []
    for arm, entry in record["offline"].items():
        row = [arm]
        for task in tasks:
            item = entry.get(task, {})
            ppl, retention = _num(item.get("perplexity"), 2), item.get("retention")
            row.append(
                ppl if retention is None else f"{ppl}; {_with(retention, item.get('retention_ci95'), 1)} %"
            )
        rows.append(row)
    return _table(["arm", *(f"{task} ppl; retention [95 %]" for task in tasks)], rows)


def markdown(record: dict) -> str:
    """The tables of docs/benchmarks.md's section, from the JSON record."""
    parts = [quality_table(record), speed_table(record)]
    if record.get("offline"):
        parts += [offline_table(record), order_table(record)]
    return "\n\n".join("\n".join(lines) for lines in parts)
