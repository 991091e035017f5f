"""Write a load-test result as a Markdown table and PNG plots (matplotlib, Agg backend, no display).

Files written into the report directory: ``loadtest.md``, ``latency_percentiles.png`` (per latency
family, the mean/median/percentiles of each model), ``throughput.png`` (measured output throughput
next to the ideal N/(N-M) times the dense model's), and with ``--sweep`` ``throughput_vs_rate.png``; with
``--slo``, the capacity plots of :mod:`loadtest.capacity_report` instead.
"""

from __future__ import annotations

from pathlib import Path

from loadtest.capacity_report import capacity_markdown, write_capacity_plots
from loadtest.compare import AA_KEYS
from loadtest.intervals import RatioEstimate, format_ratio, from_json, speedup_text
from loadtest.metrics import percentile_key


def _fmt(value, digits: int = 1) -> str:
    if value is None:
        return "–"
    if isinstance(value, int):
        return str(value)
    return f"{value:.{digits}f}"


def markdown_report(result: dict) -> str:
    """The Markdown summary of a result (per-model metrics, then each variant against the baseline), or of a
    capacity search (``--slo``: :func:`loadtest.capacity_report.capacity_markdown`)."""
    if "capacity" in result:
        return capacity_markdown(result)
    lines = [_load_line(result), "", *_metrics_table(result)]
    if result.get("comparison") or result.get("aa"):
        lines += ["", *_comparison_table(result)]
    if result.get("speculative"):
        lines += ["", *_speculative_table(result)]
    if result.get("steady"):
        lines += ["", *_steady_section(result)]
    if result.get("sweep"):
        lines += ["", *_sweep_table(result)]
    return "\n".join(lines) + "\n"


def _load_line(result: dict) -> str:
    """One sentence saying which load was sent where, with which prompts and tokenizer, on what hardware."""
    settings = result["settings"]
    return (
        f"Load: {settings['num_prompts']} requests × {result.get('rounds', settings['rounds'])} round(s), "
        f"rate {settings['rate']} req/s, burstiness {settings['burstiness']}, "
        f"max concurrency {settings['max_concurrency'] or 'none'}, {settings['input_len']} input / "
        f"{settings['output_len']} output tokens, prompts `{settings['prompts']}`, "
        f"tokenizer: {result.get('tokenizer', '?')}. Target {result['target']}; {result.get('hardware', '')}."
    )


def _metrics_table(result: dict) -> list[str]:
    """One row per model: depth, throughput, and mean and top-percentile latencies."""
    percentiles = result["settings"]["percentiles"]
    top = percentile_key("x", max(percentiles)).split("_")[0] if percentiles else None
    header = [
        "model",
        "blocks",
        "req/s",
        "output tok/s",
        "total tok/s",
        "mean TTFT ms",
        f"{top} TTFT ms",
        "mean TPOT ms",
        f"{top} TPOT ms",
        "mean ITL ms",
        "mean E2EL ms",
        f"{top} E2EL ms",
        "failed",
    ]
    lines = ["| " + " | ".join(header) + " |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for model, metrics in result["models"].items():
        blocks = metrics.get("blocks") or {}
        depth = (
            f"{blocks['num_blocks'] - blocks['removed_blocks']}/{blocks['num_blocks']}"
            if blocks.get("num_blocks")
            else "?"
        )
        row = [
            model,
            depth,
            _fmt(metrics["request_throughput"], 2),
            _fmt(metrics["output_throughput"]),
            _fmt(metrics["total_token_throughput"]),
            _fmt(metrics["mean_ttft_ms"]),
            _fmt(metrics.get(f"{top}_ttft_ms")),
            _fmt(metrics["mean_tpot_ms"], 2),
            _fmt(metrics.get(f"{top}_tpot_ms"), 2),
            _fmt(metrics["mean_itl_ms"], 2),
            _fmt(metrics["mean_e2el_ms"]),
            _fmt(metrics.get(f"{top}_e2el_ms")),
            _fmt(metrics["failed"]),
        ]
        lines.append("| " + " | ".join(row) + " |")
    return lines


def _estimate(entry: dict, key: str) -> RatioEstimate:
    """A ratio of a ``comparison`` or ``aa`` entry with its interval (``key`` and ``key + "_ci95"``)."""
    return from_json(entry.get(key), entry.get(f"{key}_ci95"))


def speedup_cell(comparison: dict) -> str:
    """The speed-up of a ``comparison`` entry (:func:`loadtest.intervals.speedup_text`)."""
    return speedup_text(
        comparison.get("output_throughput_speedup"),
        comparison.get("output_throughput_speedup_ci95"),
        comparison.get("verdict"),
    )


def _ratio_cells(ratios: dict, intervals: dict) -> list[str]:
    keys = ("mean_ttft_ms", "mean_tpot_ms", "mean_itl_ms", "mean_e2el_ms")
    return [format_ratio(from_json(ratios.get(key), intervals.get(key))) for key in keys]


def _comparison_table(result: dict, section: dict | None = None, title: str | None = None) -> list[str]:
    """One row per variant (and the A/A control): speed-up with its 95 % interval against the ideal
    N/(N-M), and the latency ratios to the baseline with theirs; notes for verdicts below the table."""
    section = section or result
    lines = [
        title
        or f"Against `{result['baseline']}` (geometric mean of per-round ratios, 95 % t-interval in "
        "brackets; latency ratio < 1 is faster):",
        "",
        "| variant | ideal N/(N-M) | output-throughput speedup | fraction of ideal speedup | "
        "fraction of ideal gain | mean TTFT ratio | mean TPOT ratio | mean ITL ratio | "
        "mean E2EL ratio |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    notes = []
    for model, comparison in section["comparison"].items():
        problem = (comparison.get("verdict") or "").startswith("measurement problem")
        row = [
            model,
            _fmt(comparison["ideal_speedup"], 3),
            speedup_cell(comparison),
            "measurement problem"
            if problem
            else format_ratio(_estimate(comparison, "fraction_of_ideal_speedup")),
            "–" if problem else _fmt(comparison["fraction_of_ideal_gain"], 3),
            *_ratio_cells(comparison["ratios"], comparison.get("ratios_ci95") or {}),
        ]
        lines.append("| " + " | ".join(row) + " |")
        if problem:
            notes.append(f"- `{model}`: {comparison['verdict']}; the load or the arms differ, not the model.")
    aa = section.get("aa")
    if aa:
        ratios = {key: aa.get(f"{key}_ratio") for key in AA_KEYS}
        intervals = {key: aa.get(f"{key}_ratio_ci95") for key in AA_KEYS}
        throughput = format_ratio(from_json(ratios["output_throughput"], intervals["output_throughput"]), "x")
        lines.append(
            f"| {result['baseline']} (A/A: noise floor) | 1.000 | {throughput} | – | – | "
            + " | ".join(_ratio_cells(ratios, intervals))
            + " |"
        )
        if not aa.get("holds_1"):
            notes.append(
                "- The A/A interval does not hold 1: identical arms measured differently, so the comparison "
                "itself is biased (order, caching, warm-up); read the speed-ups with care."
            )
    precision = section.get("precision")
    if precision:
        reached = precision.get("reached")
        notes.append(
            f"- {section.get('rounds', result.get('rounds'))} rounds; headline `{precision['headline']}` "
            f"precision ±{reached:.1%} (target ±{precision['target']:.1%}): {precision['stop_reason']}."
            if reached is not None
            else f"- {section.get('rounds', result.get('rounds'))} round(s): no interval (one round)."
        )
    return lines + ([""] + notes if notes else [])


def _speculative_table(result: dict) -> list[str]:
    """Speculative arms (``serve --speculative``): acceptance over the measured rounds beside the speed-up."""
    lines = [
        f"Speculative arms (dense verifying a draft; acceptance over the measured rounds, speed-up against "
        f"`{result['baseline']}` with its 95 % interval):",
        "",
        "| arm | drafted tokens | accepted | acceptance rate | mean accepted length | speedup |",
        "|---|---|---|---|---|---|",
    ]
    for model, entry in result["speculative"].items():
        comparison = result.get("comparison", {}).get(model)
        speedup = speedup_cell(comparison) if comparison else "–"
        lines.append(
            f"| {model} | {entry['draft_tokens']} | {entry['accepted_tokens']} | "
            f"{_fmt(entry['acceptance_rate'], 3)} | {_fmt(entry['mean_accepted_length'], 2)} | {speedup} |"
        )
    return lines


def _steady_section(result: dict) -> list[str]:
    """The comparison at the fixed Poisson rate below saturation (steady-state TTFT and TPOT)."""
    steady = result["steady"]
    title = (
        f"Steady state: Poisson arrivals at {steady['rate']:.3g} req/s (below saturation); TTFT and TPOT "
        "ratios here are the prefill and decode effects without the burst:"
    )
    return _comparison_table(result, steady, title)


def _sweep_table(result: dict) -> list[str]:
    """One row per rate step of a sweep: each model's output throughput and the failed requests."""
    models = list(result["models"])
    lines = [
        "Rate sweep (output tok/s per model; the last step is the saturation point):",
        "",
        "| rate req/s | " + " | ".join(models) + " | failed |",
        "|---" * (len(models) + 2) + "|",
    ]
    for step in result["sweep"]:
        failed = sum(step["models"][m]["failed"] for m in models)
        row = (
            [str(step["rate"])]
            + [_fmt(step["models"][m]["output_throughput"]) for m in models]
            + [str(failed)]
        )
        lines.append("| " + " | ".join(row) + " |")
    if result.get("sweep_stop_reason"):
        lines += ["", f"Sweep stopped: {result['sweep_stop_reason']}."]
    return lines


def write_plots(result: dict, directory: Path) -> list[Path]:
    """Write the PNG plots of ``result`` into ``directory``; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(result["models"])
    percentiles = result["settings"]["percentiles"]
    written: list[Path] = []

    stats = ["mean", "median"] + [percentile_key("x", p).split("_")[0] for p in percentiles]
    figure, axes = plt.subplots(1, 4, figsize=(16, 4))
    width = 0.8 / max(len(models), 1)
    for axis, (family, title) in zip(
        axes, [("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2el", "E2E latency")]
    ):
        for index, model in enumerate(models):
            values = [result["models"][model].get(f"{stat}_{family}_ms") or 0.0 for stat in stats]
            axis.bar([i + index * width for i in range(len(stats))], values, width, label=model)
        axis.set_xticks([i + width * (len(models) - 1) / 2 for i in range(len(stats))], stats)
        axis.set_title(f"{title} (ms)")
    axes[0].legend(fontsize="small")
    figure.tight_layout()
    path = directory / "latency_percentiles.png"
    figure.savefig(path, dpi=100)
    plt.close(figure)
    written.append(path)

    figure, axis = plt.subplots(figsize=(6, 4))
    measured = [result["models"][m]["output_throughput"] for m in models]
    axis.bar(models, measured, color="tab:blue", label="measured")
    baseline = result["models"].get(result.get("baseline"), {}).get("output_throughput")
    labelled = False
    for index, model in enumerate(models):
        ideal = (result.get("comparison", {}).get(model) or {}).get("ideal_speedup")
        if ideal and baseline:
            axis.hlines(
                baseline * ideal,
                index - 0.4,
                index + 0.4,
                colors="tab:red",
                label=None if labelled else "ideal N/(N-M) × dense",
            )
            labelled = True
    axis.set_ylabel("output tokens/s")
    axis.set_title("Output throughput")
    axis.legend(fontsize="small")
    figure.tight_layout()
    path = directory / "throughput.png"
    figure.savefig(path, dpi=100)
    plt.close(figure)
    written.append(path)

    if result.get("sweep"):
        figure, axis = plt.subplots(figsize=(6, 4))
        rates = [step["offered_rate"] for step in result["sweep"]]
        for model in models:
            axis.plot(
                rates,
                [step["models"][model]["output_throughput"] for step in result["sweep"]],
                marker="o",
                label=model,
            )
        axis.set_xscale("log")
        axis.set_xlabel("offered request rate (req/s)")
        axis.set_ylabel("output tokens/s")
        axis.set_title("Throughput vs request rate")
        axis.legend(fontsize="small")
        figure.tight_layout()
        path = directory / "throughput_vs_rate.png"
        figure.savefig(path, dpi=100)
        plt.close(figure)
        written.append(path)
    return written


def write_report(result: dict, directory: str | Path) -> list[Path]:
    """Write ``loadtest.md`` and the plots into ``directory`` (created); returns the written paths."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    markdown = directory / "loadtest.md"
    markdown.write_text(markdown_report(result))
    if "capacity" in result:
        return [markdown, *write_capacity_plots(result, directory)]
    return [markdown] + write_plots(result, directory)
