"""Side-by-side comparison of variants: masks, losses, evaluation scores and serving latency.

:func:`compare_variants` gathers what the registry knows about each variant into one JSON-ready entry;
:func:`comparison_rows` lays the entries out as table rows (one column per variant), which is what
``depthprune variants compare`` prints.
"""

from __future__ import annotations

from typing import Any

from registry.api import Registry, VariantReference
from registry.naming import DENSE, display_number
from registry.records import ServingBenchmarkInfo, VariantInfo

LATENCY_METRICS = (
    ("median_ttft_ms", "TTFT p50 (ms)"),
    ("p99_ttft_ms", "TTFT p99 (ms)"),
    ("median_tpot_ms", "TPOT p50 (ms)"),
    ("median_itl_ms", "ITL p50 (ms)"),
    ("median_e2el_ms", "E2E p50 (ms)"),
    ("p99_e2el_ms", "E2E p99 (ms)"),
    ("request_throughput", "requests/s"),
    ("output_throughput", "output tok/s"),
)
"""``vllm bench serve`` keys shown by ``compare``, with their row labels."""
LOAD_SETTINGS = (
    "rate",  # depthprune loadtest
    "request_rate",  # vllm bench serve
    "burstiness",
    "max_concurrency",
    "num_prompts",
    "input_len",
    "output_len",
)
"""Load settings summarised next to the latency, so that unlike runs are not compared unnoticed."""


def evaluation_key(suite: str, task: str, metric: str) -> str:
    """``suite/task/metric``, the key of an evaluation in comparisons and exports."""
    return f"{suite}/{task}/{metric}"


def load_summary(benchmark: ServingBenchmarkInfo | None) -> str | None:
    """``request_rate=4 max_concurrency=8 ...`` of a benchmark's settings, or ``None``."""
    if benchmark is None:
        return None
    parts = [f"{key}={benchmark.settings[key]}" for key in LOAD_SETTINGS if key in benchmark.settings]
    return " ".join(parts) or None


def _same_load(first: ServingBenchmarkInfo, second: ServingBenchmarkInfo) -> bool:
    return first.hardware == second.hardware and all(
        first.settings.get(key) == second.settings.get(key) for key in LOAD_SETTINGS
    )


def measured_speedup(
    registry: Registry, variant: VariantInfo, latest: ServingBenchmarkInfo | None
) -> float | None:
    """Output throughput of ``latest`` over the dense model's, from the newest dense run under the same
    load and hardware; ``None`` when there is no such run (unlike runs are never compared)."""
    if latest is None or variant.is_dense or not latest.metrics.get("output_throughput"):
        return None
    for run in registry.serving_benchmarks(f"{DENSE}@{variant.base_model}"):
        dense_throughput = run.metrics.get("output_throughput")
        if dense_throughput and _same_load(run, latest):
            return latest.metrics["output_throughput"] / dense_throughput
    return None


def interleaved_speedup(
    latest: ServingBenchmarkInfo | None,
) -> tuple[float, list[float] | None, str | None] | None:
    """``(speed-up, 95 % interval, verdict)`` that ``depthprune loadtest`` measured against dense in
    interleaved rounds (stored with the benchmark), or None for a run without that comparison."""
    if latest is None or latest.metrics.get("output_throughput_speedup") is None:
        return None
    metrics = latest.metrics
    return (
        metrics["output_throughput_speedup"],
        metrics.get("output_throughput_speedup_ci95"),
        metrics.get("verdict"),
    )


def speedup_cell(entry: dict[str, Any]) -> str:
    """``1.27× [1.21, 1.33]`` (interleaved rounds, 95 % interval), ``no measurable change (...)``,
    ``measurement problem``, or ``1.5× (separate runs, no interval)``."""
    if entry["measured_speedup"] is None:
        return "—"
    interval = entry.get("measured_speedup_ci95")
    if interval is None:
        return f"{entry['measured_speedup']:.3g}× (separate runs, no interval)"
    text = f"{entry['measured_speedup']:.2f}× [{interval[0]:.2f}, {interval[1]:.2f}]"
    verdict = entry.get("speedup_verdict") or ""
    if verdict.startswith("measurement problem"):
        return "measurement problem"
    return f"no measurable change ({text})" if verdict == "no measurable change" else text


def compare_variants(registry: Registry, references: list[VariantReference]) -> list[dict[str, Any]]:
    """One entry per variant: its record, evaluations by key, and its latest serving benchmark.

    Args:
        registry: the open registry.
        references: variants by id, name, alias or ``dense``.

    Returns:
        ``[{"variant": {...}, "mask": "■□■", "evaluations": {key: value}, "latency": {metric: value},
        "benchmark": {...} | None, "load": str | None, "ideal_speedup": N/(N-M),
        "measured_speedup": float | None, "measured_speedup_ci95": [lo, hi] | None,
        "speedup_verdict": str | None}, ...]`` in the order given: the speed-up ``depthprune loadtest``
        measured against dense in interleaved rounds when the latest benchmark has it, else the ratio to
        the newest dense run under the same load (separate runs, no interval).
    """
    entries = []
    for reference in references:
        variant = registry.resolve(reference)
        evaluations = {
            evaluation_key(item.suite, item.task, item.metric): item.value
            for item in registry.evaluations(variant)
        }
        benchmarks = registry.serving_benchmarks(variant)
        latest = benchmarks[0] if benchmarks else None
        latency = {key: latest.metrics.get(key) for key, _ in LATENCY_METRICS} if latest else {}
        interleaved = None if variant.is_dense else interleaved_speedup(latest)
        entries.append(
            {
                "variant": variant.to_dict(),
                "mask": variant.mask(),
                "evaluations": evaluations,
                "latency": latency,
                "benchmark": None if latest is None else latest.to_dict(),
                "load": load_summary(latest),
                "ideal_speedup": variant.num_blocks / (variant.num_blocks - variant.num_removed),
                "measured_speedup": interleaved[0]
                if interleaved
                else measured_speedup(registry, variant, latest),
                "measured_speedup_ci95": interleaved[1] if interleaved else None,
                "speedup_verdict": interleaved[2] if interleaved else None,
            }
        )
    return entries


def healing_summary(healing: dict | None) -> str:
    """``lora, 200 steps on pydoc (heal split); held-out loss 3.1 → 2.7`` of a healing record, or ``—``."""
    if healing is None:
        return "—"
    data = healing.get("data", "?")
    split = f" ({healing['train_split']} split)" if healing.get("train_split") else ""
    summary = f"{healing['method']}, {display_number(healing.get('steps'))} steps on {data}{split}"
    if healing.get("heldout_loss") is not None:
        before = display_number(healing.get("parent_heldout_loss"))
        summary += f"; held-out loss {before} → {display_number(healing['heldout_loss'])}"
    return summary


def _lineage_rows(entries: list[dict[str, Any]]) -> list[tuple[str, list[str]]]:
    """The parent and healing rows, when any of the variants is a healed one."""
    if not any(entry["variant"].get("healing") for entry in entries):
        return []

    def parent(entry: dict[str, Any]) -> str:
        if entry["variant"].get("healing") is None:
            return "—"
        return entry["variant"].get("parent") or "— (removed)"

    def healing_loss(entry: dict[str, Any], key: str) -> str:
        return display_number((entry["variant"].get("healing") or {}).get(key))

    return [
        ("healed from", [parent(entry) for entry in entries]),
        ("healing", [healing_summary(entry["variant"].get("healing")) for entry in entries]),
        ("healing train loss", [healing_loss(entry, "train_loss") for entry in entries]),
        ("healing held-out loss", [healing_loss(entry, "heldout_loss") for entry in entries]),
    ]


def _calibration_budget(entry: dict[str, Any]) -> str:
    calibration = entry["variant"]["calibration"]
    if calibration.get("samples") is None and calibration.get("seq_len") is None:
        return "—"
    return f"{display_number(calibration.get('samples'))} × {display_number(calibration.get('seq_len'))}"


def comparison_rows(entries: list[dict[str, Any]]) -> list[tuple[str, list[str]]]:
    """``(label, one cell per variant)`` rows for a table with one column per variant."""

    def row(label: str, cell) -> tuple[str, list[str]]:
        return label, [cell(entry) for entry in entries]

    def variant_field(name: str, digits: int = 4):
        return lambda entry: display_number(entry["variant"].get(name), digits)

    def calibration_field(name: str):
        return lambda entry: display_number(entry["variant"]["calibration"].get(name))

    rows = [
        row("base model", lambda entry: entry["variant"]["base_model"]),
        row("removed", lambda entry: " ".join(map(str, entry["variant"]["removed_blocks"])) or "none"),
        row("mask (■ kept, □ removed)", lambda entry: entry["mask"]),
        row(
            "blocks",
            lambda entry: (
                f"{entry['variant']['num_blocks'] - entry['variant']['num_removed']}"
                f"/{entry['variant']['num_blocks']}"
            ),
        ),
        row("objective", calibration_field("objective")),
        row("data", calibration_field("data")),
        row("samples × seq_len", _calibration_budget),
        row("search", lambda entry: entry["variant"]["search"]),
        row("calibration loss", variant_field("calibration_loss")),
        row("dense loss", variant_field("dense_loss")),
        row("search time (s)", variant_field("search_seconds", 3)),
        row("block forwards", variant_field("block_forwards")),
        *_lineage_rows(entries),
    ]
    evaluation_keys = sorted({key for entry in entries for key in entry["evaluations"]})
    rows.extend(
        row(key, lambda entry, key=key: display_number(entry["evaluations"].get(key)))
        for key in evaluation_keys
    )
    if any(entry["latency"] for entry in entries):
        rows.append(row("load", lambda entry: entry["load"] or "—"))
        rows.append(row("ideal block speed-up", lambda entry: f"{entry['ideal_speedup']:.3g}×"))
        rows.append(
            row(
                "speed-up vs dense (output tok/s)",
                speedup_cell,
            )
        )
        for key, label in LATENCY_METRICS:
            if all(entry["latency"].get(key) is None for entry in entries):
                continue  # a metric no run reported would only add a row of dashes
            rows.append(row(label, lambda entry, key=key: display_number(entry["latency"].get(key))))
    return rows
