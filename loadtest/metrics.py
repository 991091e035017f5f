"""Turn per-request measurements into the summary ``vllm bench serve`` prints and saves.

The definitions and key names are vLLM's (``vllm/benchmarks/serve.py: calculate_metrics``), so a result
of ``depthprune loadtest`` can be compared key by key with one of ``vllm bench serve``:

- TTFT: time to the first token; TPOT: ``(latency - ttft) / (output_tokens - 1)`` per request with more
  than one output token (the first token excluded); ITL: every gap between streamed chunks, pooled over
  requests; E2EL: request latency. Each as mean, median, std (population), and percentiles, in ms.
- Throughputs divide by the wall duration of the run: completed requests, output tokens, and
  prompt + output tokens per second.
- Goodput: completed requests per second that met every given SLO (``ttft``, ``tpot``, ``e2el`` in ms;
  a one-token request counts TPOT 0).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np

from loadtest.client import RequestResult

LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el")
"""The latency families, in vLLM's order."""
GOODPUT_METRICS = ("ttft", "tpot", "e2el")
"""The metrics an SLO can bound (vLLM's ``--goodput`` keys)."""
DEFAULT_PERCENTILES = (90.0, 99.0)


def percentile_key(metric: str, percentile: float) -> str:
    """``p99_ttft_ms`` style key, as vLLM writes it (``p99.9_ttft_ms`` for fractions)."""
    word = str(int(percentile)) if int(percentile) == percentile else str(percentile)
    return f"p{word}_{metric}_ms"


def parse_goodput(specs: Sequence[str]) -> dict[str, float]:
    """``["ttft:500", "tpot:50"]`` (or one ``"ttft:500 tpot:50"``) -> ``{"ttft": 500.0, "tpot": 50.0}`` (ms).

    Raises:
        ValueError: on an unknown metric, a missing ``:``, or a value that is not a positive number.
    """
    slos: dict[str, float] = {}
    for spec in (part for item in specs for part in item.replace(",", " ").split()):
        name, sep, value = spec.partition(":")
        if not sep or name not in GOODPUT_METRICS:
            raise ValueError(
                f"goodput SLO {spec!r} must be KEY:MS with KEY one of {', '.join(GOODPUT_METRICS)}"
            )
        try:
            slos[name] = float(value)
        except ValueError:
            raise ValueError(f"goodput SLO {spec!r}: {value!r} is not a number of milliseconds") from None
        if slos[name] <= 0:
            raise ValueError(f"goodput SLO {spec!r} must be positive")
    return slos


def summarize(values_s: Sequence[float], metric: str, percentiles: Sequence[float]) -> dict[str, float]:
    """mean/median/std/percentiles of ``values_s`` (seconds) as ``{mean_<metric>_ms: ...}``; 0 when empty."""
    values = np.asarray(values_s if len(values_s) else [0.0], dtype=float) * 1000.0
    summary = {
        f"mean_{metric}_ms": float(np.mean(values)),
        f"median_{metric}_ms": float(np.median(values)),
        f"std_{metric}_ms": float(np.std(values)),
    }
    for percentile in percentiles:
        summary[percentile_key(metric, percentile)] = float(np.percentile(values, percentile))
    return summary


def compute_metrics(
    results: Sequence[RequestResult],
    duration_s: float,
    *,
    goodput_slos_ms: dict[str, float] | None = None,
    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
) -> dict:
    """The ``vllm bench serve`` summary of one run.

    Args:
        results: One :class:`RequestResult` per benchmark request (warm-ups excluded).
        duration_s: Wall seconds from the first arrival to the last completion.
        goodput_slos_ms: Optional SLOs in ms, keys among ``ttft``, ``tpot``, ``e2el``.
        percentiles: Percentiles to report for each latency family.

    Returns:
        A dict with ``duration, completed, failed, total_input_tokens, total_output_tokens,
        request_throughput, request_goodput, output_throughput, total_token_throughput``, the
        ``{mean,median,std,pNN}_{ttft,tpot,itl,e2el}_ms`` keys, ``max_concurrent_requests`` and
        ``errors`` (count by kind).
    """
    if duration_s <= 0:
        raise ValueError("duration_s must be positive")
    ttfts: list[float] = []
    tpots: list[float] = []
    tpots_for_goodput: list[float] = []
    itls: list[float] = []
    e2els: list[float] = []
    total_input = total_output = completed = 0
    for result in results:
        if not result.success:
            continue
        output_len = result.output_tokens or 1
        total_input += result.prompt_len
        total_output += output_len
        tpot = 0.0
        if output_len > 1:
            tpot = (result.latency - result.ttft) / (output_len - 1)
            tpots.append(tpot)
        tpots_for_goodput.append(tpot)
        itls.extend(result.itl)
        ttfts.append(result.ttft)
        e2els.append(result.latency)
        completed += 1

    good = 0
    if goodput_slos_ms:
        per_metric = {"ttft": ttfts, "tpot": tpots_for_goodput, "e2el": e2els}
        for index in range(completed):
            if all(per_metric[name][index] * 1000.0 <= slo for name, slo in goodput_slos_ms.items()):
                good += 1

    metrics: dict = {
        "duration": duration_s,
        "completed": completed,
        "failed": len(results) - completed,
        "total_input_tokens": total_input,
        "total_output_tokens": total_output,
        "request_throughput": completed / duration_s,
        "request_goodput": good / duration_s if goodput_slos_ms else None,
        "output_throughput": total_output / duration_s,
        "total_token_throughput": (total_input + total_output) / duration_s,
    }
    for name, values in (("ttft", ttfts), ("tpot", tpots), ("itl", itls), ("e2el", e2els)):
        metrics.update(summarize(values, name, percentiles))
    metrics["max_concurrent_requests"] = max_concurrency_seen(results)
    metrics["errors"] = dict(Counter(r.error_kind or "unknown" for r in results if not r.success))
    return metrics


def max_concurrency_seen(results: Sequence[RequestResult]) -> int:
    """The most successful requests in flight at one instant (exact, from start and end times)."""
    events: list[tuple[float, int]] = []
    for result in results:
        if result.success:
            # An end sorts before a start at the same instant: touching requests do not overlap.
            events.append((result.start_time, 1))
            events.append((result.start_time + result.latency, -1))
    in_flight = peak = 0
    for _, change in sorted(events):
        in_flight += change
        peak = max(peak, in_flight)
    return peak
