"""Capacities and capacity ratios with 95 % intervals, from the replicates of a capacity search.

**Method: repeated bracketing.** Every replicate is a complete, independent search of every arm (new prompts,
new arrival times, its own start rate), so the replicates' capacities of one arm are independent draws of
the same measurement; and within a replicate the arms were measured interleaved step by step under the same
conditions, so the replicate's ratio ``capacity(arm) / capacity(dense)`` is a *paired* quantity in which slow
drift of the machine cancels, as the per-round ratios of the saturation test (:mod:`loadtest.intervals`).

- ``capacity_rps``: the geometric mean over complete replicates; ``capacity_rps_ci95`` Student's t-interval
  on their logarithms (``scipy.stats.t.interval`` with ``scipy.stats.sem``), mapped back with ``exp``.
- ``capacity_ratio``: the geometric mean of the per-replicate ratios to the baseline; ``capacity_ratio_ci95``
  the t-interval on their logarithms.
- **The search's resolution is a floor.** One replicate knows its capacity only to its final bracket (within
  ``1 + resolution``); replicates that happen to agree exactly (identical arms bisect the same way) would give
  a zero-width interval, so no interval is narrower than half the bracket on the log scale, ``log(1 +
  resolution) / 2`` for a capacity and ``sqrt(2)`` times that for a ratio of two capacities (two independent
  quantisation errors). Replicates start at dithered rates so their grids differ and the errors average out.
- Why not a bootstrap: replicates are few (2 to 5) and a percentile bootstrap of so few values cannot reach
  beyond the observed extremes, so it is too narrow; the t-interval on log values is the one the saturation
  test uses, for the same reason.
- **One replicate** (the budget allowed no second): the interval is the bracket itself, ``[low, high]`` for a
  capacity and ``[low_a / high_b, high_a / low_b]`` for a ratio, and ``interval`` says so: it bounds the
  quantisation, not the run-to-run noise.
- **Capacity 0** (the SLO missed even at the lowest rate tried): ``capacity_rps`` 0 with the interval
  ``[0, lowest rate tried]``; no ratio is formed with a zero capacity.

Verdicts: ``no measurable change`` when a ratio's interval holds 1; the A/A arm (dense measured again as its
own arm) is the noise floor, and an A/A interval that does not reach 1 says the comparison itself is biased.
The ideal N/(N-M) is shown for reference but is **not** a ceiling here: at a latency objective a model whose
every request is faster also has headroom left (dense at rate λ and the variant at k·λ have the same queue,
the variant's latencies scaled by 1/k), so its capacity ratio can exceed N/(N-M) without any fault; that
ceiling holds for throughput at saturation (docs/benchmarks.md, "Capacity at a latency objective").
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from loadtest.bracket import Bracket
from loadtest.capacity import CapacitySearch, Replicate
from loadtest.compare import BlockCounts
from loadtest.intervals import CONFIDENCE, RatioEstimate

REPEAT_METHOD = "t-interval over replicates (log scale)"
BRACKET_METHOD = "one replicate: the search's bracket"


def log_t_estimate(values: Sequence[float], floor_half_width: float = 0.0) -> RatioEstimate:
    """Geometric mean of positive ``values`` with the 95 % t-interval of their logs, at least
    ``floor_half_width`` wide on each side (log scale); one value gives no interval."""
    from scipy import stats

    logs = [math.log(value) for value in values]
    if not logs:
        return RatioEstimate(None, None, None, 0)
    mean = sum(logs) / len(logs)
    if len(logs) == 1:
        return RatioEstimate(math.exp(mean), None, None, 1)
    sem = float(stats.sem(logs))
    half = 0.0
    if sem > 0:
        low, _ = stats.t.interval(CONFIDENCE, len(logs) - 1, loc=mean, scale=sem)
        half = mean - float(low)
    half = max(half, floor_half_width)
    return RatioEstimate(math.exp(mean), math.exp(mean - half), math.exp(mean + half), len(logs))


def bracket_interval(bracket: Bracket) -> list[float]:
    """``[low, high]`` of one search; capacity 0: ``[0, lowest miss]``; censored: ``[low, ceiling]``."""
    if bracket.low is None:
        return [0.0, min(bracket.failed, default=bracket.floor)]
    top = min(bracket.high or math.inf, bracket.ceiling)
    return [bracket.low, top if math.isfinite(top) else bracket.low]


def arm_capacity(arm: str, replicates: Sequence[Replicate], resolution: float) -> dict:
    """``capacity_rps``, ``capacity_rps_ci95`` and how they were formed, for one arm."""
    brackets = [replicate.brackets[arm] for replicate in replicates]
    capacities = [bracket.capacity for bracket in brackets]
    entry = {
        "per_replicate": capacities,
        "censored": any(bracket.censored for bracket in brackets),
        "stop_reasons": [bracket.stop_reason() for bracket in brackets],
    }
    if len(brackets) == 1 or not any(capacities):
        low = min(bracket_interval(bracket)[0] for bracket in brackets)
        high = max(bracket_interval(bracket)[1] for bracket in brackets)
        point = capacities[0] if len(brackets) == 1 else 0.0
        method = BRACKET_METHOD if len(brackets) == 1 else "capacity 0 in every replicate"
        return {**entry, "capacity_rps": point, "capacity_rps_ci95": [low, high], "interval": method}
    if all(capacities):
        estimate = log_t_estimate(capacities, math.log(1 + resolution) / 2)
        return {
            **entry,
            "capacity_rps": estimate.point,
            "capacity_rps_ci95": estimate.ci95,
            "interval": REPEAT_METHOD,
        }
    from scipy import stats

    mean, sem = sum(capacities) / len(capacities), float(stats.sem(capacities))
    low, high = stats.t.interval(CONFIDENCE, len(capacities) - 1, loc=mean, scale=sem)
    return {
        **entry,
        "capacity_rps": mean,
        "capacity_rps_ci95": [max(0.0, float(low)), float(high)],
        "interval": "t-interval over replicates (linear scale: some replicates found capacity 0)",
    }


def capacity_ratio(arm: str, baseline: str, replicates: Sequence[Replicate], resolution: float) -> dict:
    """``capacity_ratio`` of ``arm`` to ``baseline`` with ``capacity_ratio_ci95`` (None where undefined)."""
    pairs = [(r.brackets[arm], r.brackets[baseline]) for r in replicates]
    ratios = [a.capacity / b.capacity for a, b in pairs if a.capacity and b.capacity]
    if len(pairs) >= 2 and len(ratios) >= 2:
        estimate = log_t_estimate(ratios, math.sqrt(2) * math.log(1 + resolution) / 2)
        return {
            "capacity_ratio": estimate.point,
            "capacity_ratio_ci95": estimate.ci95,
            "ratio_interval": REPEAT_METHOD,
        }
    if len(pairs) == 1 and ratios:
        (arm_low, arm_high), (base_low, base_high) = (bracket_interval(bracket) for bracket in pairs[0])
        return {
            "capacity_ratio": ratios[0],
            "capacity_ratio_ci95": [arm_low / base_high, arm_high / base_low],
            "ratio_interval": BRACKET_METHOD,
        }
    return {
        "capacity_ratio": None,
        "capacity_ratio_ci95": None,
        "ratio_interval": "undefined: a capacity of 0 (or too few replicates with both capacities above 0)",
    }


def ratio_verdict(entry: dict) -> str | None:
    """``no measurable change`` when the ratio's interval holds 1, else None."""
    interval = entry.get("capacity_ratio_ci95")
    if interval and interval[0] <= 1.0 <= interval[1]:
        return "no measurable change"
    return None


def capacity_section(
    search: CapacitySearch, baseline: str, counts: dict[str, BlockCounts | None], aa_arm: str | None
) -> dict:
    """The result's ``capacity`` part: the SLO, the method, every arm's capacity and ratio, A/A, all steps."""
    config = search.config
    complete = [replicate for replicate in search.replicates if replicate.complete]
    # A budget that cut the first replicate leaves only its partial brackets: better than nothing, and said.
    counted = complete or search.replicates[:1]
    arms = {}
    for arm in search.replicates[0].brackets if search.replicates else []:
        entry = arm_capacity(arm, counted, config.resolution)
        block = counts.get(arm)
        entry["ideal_speedup"] = block.ideal_speedup if block else None
        entry["blocks"] = f"{block.num_blocks - block.removed}/{block.num_blocks}" if block else None
        if arm != baseline:
            entry.update(capacity_ratio(arm, baseline, counted, config.resolution))
            ideal, ratio = entry["ideal_speedup"], entry["capacity_ratio"]
            entry["fraction_of_ideal"] = ratio / ideal if ideal and ratio is not None else None
            entry["verdict"] = ratio_verdict(entry)
        arms[arm] = entry
    section = {
        "slo": config.slo.as_dict(),
        "slo_text": config.slo.describe(),
        "method": "repeated bracketing: " + REPEAT_METHOD,
        "resolution": config.resolution,
        "stream_rate": search.stream_rate,
        "start_rates": search.start_rates,
        "probe": search.probe,
        "step_requests_for_percentile": config.percentile_requests(),
        "percentile_support": percentile_support(search),
        "replicates": len(complete),
        "replicates_run": len(search.replicates),
        "first_replicate_incomplete": not complete and bool(search.replicates),
        "stop_reason": search.stop_reason,
        "arms": arms,
        "steps": [step for replicate in search.replicates for step in _marked(replicate)],
    }
    if aa_arm in arms:
        aa = arms[aa_arm]
        section["aa"] = {
            "capacity_ratio": aa.get("capacity_ratio"),
            "capacity_ratio_ci95": aa.get("capacity_ratio_ci95"),
            "holds_1": ratio_verdict(aa) == "no measurable change",
        }
    return section


def percentile_support(search: CapacitySearch) -> str | None:
    """A warning when ``--num-prompts`` capped counted steps below the requests the SLO's percentile needs
    (:meth:`loadtest.capacity.CapacityConfig.percentile_requests`), else None."""
    needed = search.config.percentile_requests()
    steps = [step for replicate in search.replicates for step in replicate.steps if step["counted"]]
    fewest = min((step["requests"] for step in steps), default=needed)
    if fewest >= needed:
        return None
    top = max(search.config.slo.percentiles)
    above = fewest * (1 - top / 100)
    return (
        f"p{top:g} needs {needed} requests per step for {search.config.tail_requests} at or above it; "
        f"steps had as few as {fewest} (--num-prompts): about {above:.1f} requests decided a step's p{top:g}"
    )


def _marked(replicate: Replicate) -> list[dict]:
    """The replicate's steps, each saying whether its replicate counted (was complete)."""
    return [{**step, "replicate_complete": replicate.complete} for step in replicate.steps]
