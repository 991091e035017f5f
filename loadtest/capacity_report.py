"""The capacity search's report: a Markdown table, and two plots (matplotlib, Agg backend, no display).

``capacity_latency.png``: per latency family, p99 (solid) and p50 (dashed) against the offered rate of every
counted step, one colour per arm, the SLO as a horizontal line and each arm's capacity as a dotted vertical
one. ``capacity_frontier.png``: per step, output tokens per second per user (1000 / mean TPOT) against total
output tokens per second, with each arm's Pareto frontier (the steps no other step of the arm beats on both),
the trade-off ``vllm bench sweep plot_pareto`` draws.
"""

from __future__ import annotations

from pathlib import Path

from loadtest.intervals import format_ratio, from_json

FAMILIES = (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2el", "E2E latency"))
"""Latency families of the latency plot: metric name, title."""
SLO_FAMILY = {"ttft": "ttft", "tpot": "tpot", "itl": "itl", "e2el": "e2e"}


def _interval(values: list[float] | None) -> str:
    return f"[{values[0]:.3g}, {values[1]:.3g}]" if values else ""


def capacity_markdown(result: dict) -> str:
    """The Markdown summary of a capacity result: one row per arm, then the notes."""
    capacity, settings = result["capacity"], result["settings"]
    lines = [
        f"Capacity at {capacity['slo_text']}: the highest Poisson request rate (open loop, burstiness "
        f"{settings['burstiness']}) at which every objective held, {settings['input_len']} input / "
        f"{settings['output_len']} output tokens, prompts `{settings['prompts']}`. "
        f"Target {result['target']}; {result.get('hardware', '')}.",
        "",
        "| arm | blocks | capacity req/s [95 %] | capacity × dense [95 %] | ideal N/(N-M) | verdict |",
        "|---|---|---|---|---|---|",
    ]
    notes = []
    for arm, entry in capacity["arms"].items():
        ratio = "–"
        if arm != result["baseline"]:
            estimate = from_json(entry.get("capacity_ratio"), entry.get("capacity_ratio_ci95"))
            ratio = format_ratio(estimate, "x")
        name = f"{arm} (noise floor)" if arm == result["baseline"] + " (A/A)" else arm
        ideal = f"{entry['ideal_speedup']:.2f}" if entry.get("ideal_speedup") else "?"
        cells = [name, entry.get("blocks") or "?", f"{entry['capacity_rps']:.3g} "]
        cells[-1] += _interval(entry["capacity_rps_ci95"])
        lines.append("| " + " | ".join([*cells, ratio, ideal, entry.get("verdict") or ""]) + " |")
        notes += _arm_notes(arm, entry, capacity)
    steps = capacity["steps"]
    not_counted = sum(1 for step in steps if not step["counted"])
    notes.insert(
        0,
        f"- {capacity['replicates']} complete replicate(s) of {capacity['replicates_run']} run "
        f"({capacity['method']}; resolution {capacity['resolution']:.0%}): {capacity['stop_reason']}. "
        f"{len(steps)} steps, {not_counted} not counted (the client fell > 10 % behind its schedule).",
    )
    if capacity.get("probe"):
        probe = ", ".join(f"{arm} {entry['throughput_rps']:.3g}" for arm, entry in capacity["probe"].items())
        notes.insert(
            1,
            f"- Saturation probe (req/s, one burst per arm): {probe}; each search started at "
            f"{_fraction_text(capacity)} of its arm's.",
        )
    if capacity.get("percentile_support"):
        notes.append(f"- Too few requests per step for the percentile: {capacity['percentile_support']}.")
    aa = capacity.get("aa")
    if aa and not aa["holds_1"]:
        notes.append(
            "- The A/A interval does not hold 1: identical arms measured differently, so the comparison "
            "itself is biased (order, caching, warm-up); read the ratios with care."
        )
    return "\n".join([*lines, "", *notes]) + "\n"


def _fraction_text(capacity: dict) -> str:
    """``0.5`` of the probe, as the first rates say (the same fraction for every arm)."""
    fractions = {
        round(capacity["start_rates"][arm] / entry["throughput_rps"], 2)
        for arm, entry in capacity["probe"].items()
        if entry["throughput_rps"] and arm in capacity.get("start_rates", {})
    }
    return " / ".join(f"{fraction:g}" for fraction in sorted(fractions)) or "?"


def _arm_notes(arm: str, entry: dict, capacity: dict) -> list[str]:
    """Notes on one arm: capacity 0, a lower bound only, a single replicate, a ratio above the ideal."""
    notes = []
    if not entry["capacity_rps"]:
        reasons = "; ".join(filter(None, entry["stop_reasons"]))
        notes.append(
            f"- `{arm}`: capacity 0 at this SLO: it missed the objectives at every rate tried, down to "
            f"{entry['capacity_rps_ci95'][1]:.3g} req/s ({reasons})."
        )
    elif entry["censored"]:
        notes.append(f"- `{arm}`: a lower bound: no rate above it missed the SLO before the search stopped.")
    if entry["interval"] != "t-interval over replicates (log scale)":
        notes.append(f"- `{arm}`: interval from {entry['interval']}.")
    fraction = entry.get("fraction_of_ideal")
    if fraction is not None and fraction > 1 and (entry.get("ideal_speedup") or 1) > 1:
        notes.append(
            f"- `{arm}`: {fraction:.2f} of the ideal N/(N-M): expected at a latency objective (faster "
            "requests leave headroom under the same target), not a fault; the ideal bounds throughput at "
            "saturation."
        )
    return notes


def write_capacity_plots(result: dict, directory: Path) -> list[Path]:
    """Write ``capacity_latency.png`` and ``capacity_frontier.png``; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    capacity = result["capacity"]
    steps = [step for step in capacity["steps"] if step["counted"] and step["completed"]]
    arms = list(capacity["arms"])
    colours = {arm: f"C{index}" for index, arm in enumerate(arms)}
    targets = capacity["slo"]

    figure, axes = plt.subplots(1, len(FAMILIES), figsize=(4.2 * len(FAMILIES), 4))
    for axis, (family, title) in zip(axes, FAMILIES):
        top = _plotted_percentile(targets, SLO_FAMILY[family])
        for arm in arms:
            mine = sorted((s for s in steps if s["arm"] == arm), key=lambda s: s["requested_rps"])
            rates = [s["requested_rps"] for s in mine]
            colour = colours[arm]
            tail = [s[f"p{top}_{family}_ms"] for s in mine]
            axis.plot(rates, tail, "o-", color=colour, label=f"{arm} p{top}")
            axis.plot(rates, [s[f"p50_{family}_ms"] for s in mine], ".--", color=colour, alpha=0.6)
            if capacity["arms"][arm]["capacity_rps"]:
                axis.axvline(capacity["arms"][arm]["capacity_rps"], color=colours[arm], linestyle=":")
        for name, target in targets.items():
            if name.startswith(SLO_FAMILY[family] + "_"):
                axis.axhline(target, color="red", linestyle="--", label=f"SLO {name} {target:g}")
        axis.set_xscale("log")
        axis.set_xlabel("offered rate (req/s)")
        axis.set_title(f"{title} (ms): p{top} solid, p50 dashed")
    axes[0].legend(fontsize="small")
    figure.tight_layout()
    latency = directory / "capacity_latency.png"
    figure.savefig(latency, dpi=100)
    plt.close(figure)

    figure, axis = plt.subplots(figsize=(6, 4.5))
    for arm in arms:
        points = [
            (s["output_throughput"], 1000.0 / s["mean_tpot_ms"])
            for s in steps
            if s["arm"] == arm and s.get("mean_tpot_ms")
        ]
        if points:
            axis.scatter(*zip(*points), color=colours[arm], s=14, alpha=0.5)
        frontier = pareto_frontier(points)
        if frontier:
            axis.plot(*zip(*frontier), "-", color=colours[arm], label=arm)
    axis.set_xlabel("total output tokens/s")
    axis.set_ylabel("output tokens/s per user (1000 / mean TPOT)")
    axis.set_title(f"Throughput per user vs total ({capacity['slo_text']})", fontsize="small")
    axis.legend(fontsize="small")
    figure.tight_layout()
    frontier_path = directory / "capacity_frontier.png"
    figure.savefig(frontier_path, dpi=100)
    plt.close(figure)
    return [latency, frontier_path]


def _plotted_percentile(targets: dict[str, float], family: str) -> str:
    """The percentile the SLO bounds for ``family`` (``90`` for ``tpot_p90_ms``), else ``99``."""
    for name in targets:
        if name.startswith(family + "_p"):
            return name[len(family) + 2 : -len("_ms")]
    return "99"


def pareto_frontier(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The points no other point beats on both coordinates (higher is better on each), by the first."""
    frontier: list[tuple[float, float]] = []
    for x, y in sorted(points, key=lambda point: (-point[0], -point[1])):
        if not frontier or y > frontier[-1][1]:
            frontier.append((x, y))
    return sorted(frontier)
