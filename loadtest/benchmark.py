"""A whole load test: warm-ups, interleaved rounds at one rate or a sweep of rates, and the result dict.

The result dict is what ``--save-result`` writes and ``--json`` prints: ``models`` holds each model's
``vllm bench serve`` metrics pooled over the rounds (plus ``rounds``, the per-round metrics, and
``blocks``), ``comparison`` each variant's ratios to the baseline with the ideal speedup and
``fraction_of_ideal_speedup``, and with a sweep ``sweep`` holds one entry per rate step.
"""

from __future__ import annotations

import asyncio
import datetime
import math
import os
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from loadtest.client import RequestResult
from loadtest.compare import BlockCounts, ratios_to_baseline, speedup_summary
from loadtest.config import LoadConfig
from loadtest.metrics import compute_metrics
from loadtest.prompts import Prompt
from loadtest.runner import RunResult, interleaved_rounds, make_client, warm_up


@dataclass
class SweepConfig:
    """How ``--sweep`` steps the request rate up to saturation."""

    start_rate: float | None = None
    """First rate in req/s; None = one request stream's rate, 1 / (warm-up E2E latency)."""
    factor: float = 2.0
    """Each step multiplies the rate by this."""
    max_steps: int = 8
    """At most this many rates."""
    min_growth: float = 0.05
    """Saturation: the baseline's output throughput grew less than this fraction over the best before."""
    max_total_s: float = 3600.0
    """No new step starts after this many seconds."""

    def __post_init__(self):
        from depthprune.core.errors import UserError

        if self.start_rate is not None and not (self.start_rate > 0 and math.isfinite(self.start_rate)):
            raise UserError("the sweep's start rate must be a positive finite number")
        if self.factor <= 1:
            raise UserError(f"the sweep factor must be above 1, got {self.factor}")
        if not 1 <= self.max_steps <= 50:
            raise UserError(f"--sweep-steps must be in 1..50, got {self.max_steps}")
        if not 0 <= self.min_growth < 1 or self.max_total_s <= 0:
            raise UserError("the sweep's growth threshold must be in [0, 1) and its time limit positive")


@dataclass
class Measurement:
    """The runs of every model at one rate."""

    rate: float
    """Offered request rate (``inf`` = all at once)."""
    runs: list[RunResult] = field(default_factory=list)
    """Every run, in the order they ran."""

    def per_round_metrics(self, config: LoadConfig) -> dict[str, list[dict]]:
        """``model -> [metrics of each round]``."""
        per_model: dict[str, list[dict]] = {}
        for run in sorted(self.runs, key=lambda run: run.round):
            per_model.setdefault(run.model, []).append(run.metrics(config))
        return per_model

    def pooled_metrics(self, config: LoadConfig) -> dict[str, dict]:
        """``model -> metrics`` over all rounds together (requests pooled, durations summed)."""
        requests: dict[str, list[RequestResult]] = {}
        durations: dict[str, float] = {}
        for run in self.runs:
            requests.setdefault(run.model, []).extend(run.requests)
            durations[run.model] = durations.get(run.model, 0.0) + run.duration_s
        return {
            model: compute_metrics(
                requests[model],
                durations[model],
                goodput_slos_ms=config.goodput_slos_ms,
                percentiles=config.percentiles,
            )
            for model in requests
        }

    def failed(self) -> int:
        """Failed requests over all runs."""
        return sum(1 for run in self.runs for request in run.requests if not request.success)


def hardware_description() -> str:
    """CPU model and core count (or GPU when torch sees one), for the registry's ``hardware`` field."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} logical cores, {platform.system()} {platform.release()}"


class Benchmark:
    """Measures several models of one or more servers under identical load."""

    def __init__(
        self,
        targets: dict[str, str],
        config: LoadConfig,
        *,
        api_key: str | None = None,
        progress: Callable[[str, int], object] | None = None,
    ):
        """Args:
        targets: ``model -> base URL``; the first model is the default baseline.
        config: Load settings.
        api_key: Bearer token for the servers, if they need one.
        progress: ``progress(description, total)`` returning an object with ``update()`` and ``close()``
            (a tqdm bar); None for silence.
        """
        self.targets, self.config, self.api_key, self.progress = targets, config, api_key, progress

    def _bar(self, description: str, total: int):
        return self.progress(description, total) if self.progress else None

    async def warm_up(self, prompts: Sequence[Prompt]) -> dict[str, list[RequestResult]]:
        """Send the warm-up prompts to every model; ``model -> results``."""
        results: dict[str, list[RequestResult]] = {}
        async with make_client(self.config, self.api_key) as client:
            for model, target in self.targets.items():
                results[model] = await warm_up(client, target, model, prompts, self.config)
        return results

    async def measure(
        self, prompts_per_round: Sequence[Sequence[Prompt]], rate: float | None = None
    ) -> Measurement:
        """Interleaved rounds of every model at ``rate`` (default: the configured rate)."""
        rate = self.config.rate if rate is None else rate
        total = len(self.targets) * sum(len(prompts) for prompts in prompts_per_round)
        bar = self._bar(f"rate {rate:g} req/s", total)
        try:
            async with make_client(self.config, self.api_key) as client:
                runs = await interleaved_rounds(
                    client,
                    self.targets,
                    prompts_per_round,
                    self.config,
                    rate=rate,
                    on_request_done=bar.update if bar else None,
                )
        finally:
            if bar:
                bar.close()
        return Measurement(rate=rate, runs=runs)

    async def sweep(
        self,
        prompts_per_round: Sequence[Sequence[Prompt]],
        sweep: SweepConfig,
        baseline: str,
        first_rate: float,
    ) -> tuple[list[Measurement], str]:
        """Step the rate up by ``sweep.factor`` from ``first_rate`` until saturation, errors or a limit.

        Returns:
            The measurements in rate order and why the sweep stopped.
        """
        steps: list[Measurement] = []
        best = 0.0
        started = time.monotonic()
        rate = first_rate
        for _ in range(sweep.max_steps):
            if time.monotonic() - started > sweep.max_total_s:
                return steps, f"time limit of {sweep.max_total_s:g} s reached"
            step = await self.measure(prompts_per_round, rate=rate)
            steps.append(step)
            if step.failed():
                return steps, f"{step.failed()} failed request(s) at {rate:g} req/s"
            throughput = step.pooled_metrics(self.config)[baseline]["output_throughput"]
            if best and throughput < best * (1 + sweep.min_growth):
                return steps, (
                    f"saturated: {baseline}'s output throughput grew less than "
                    f"{sweep.min_growth:.0%} at {rate:g} req/s"
                )
            best = max(best, throughput)
            rate *= sweep.factor
        return steps, f"{sweep.max_steps} steps done (raise --sweep-steps to go further)"


def summarize_measurement(
    measurement: Measurement, config: LoadConfig, baseline: str, counts: dict[str, BlockCounts | None]
) -> tuple[dict, dict]:
    """``(models, comparison)`` parts of the result for one measurement."""
    pooled = measurement.pooled_metrics(config)
    per_round = measurement.per_round_metrics(config)
    models = {}
    for model, metrics in pooled.items():
        block = counts.get(model)
        models[model] = {
            **metrics,
            "rounds": per_round[model],
            "blocks": {
                "num_blocks": block.num_blocks,
                "removed_blocks": block.removed,
                "source": block.source,
            }
            if block
            else None,
        }
    comparison = {}
    for model, ratios in ratios_to_baseline(per_round, baseline).items():
        comparison[model] = {
            **speedup_summary(ratios["output_throughput"], counts.get(model)),
            "ratios": ratios,
        }
    return models, comparison


def build_result(
    *,
    target: str,
    targets: dict[str, str],
    config: LoadConfig,
    baseline: str,
    counts: dict[str, BlockCounts | None],
    measurement: Measurement,
    tokenizer: str,
    sweep_steps: Sequence[Measurement] = (),
    sweep_stop_reason: str | None = None,
) -> dict:
    """The result dict of a load test (see the module docstring)."""
    from depthprune import __version__

    models, comparison = summarize_measurement(measurement, config, baseline, counts)
    result = {
        "tool": "depthprune loadtest",
        "depthprune_version": __version__,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "target": target,
        "targets": targets,
        "hardware": hardware_description(),
        "backend": "openai-completions (streaming)",
        "settings": {
            **config.as_dict(),
            "measured_rate": "inf" if math.isinf(measurement.rate) else measurement.rate,
        },
        "tokenizer": tokenizer,
        "baseline": baseline,
        "models": models,
        "comparison": comparison,
    }
    if sweep_steps:
        result["sweep"] = []
        for step in sweep_steps:
            pooled = step.pooled_metrics(config)
            result["sweep"].append(
                {
                    "rate": "inf" if math.isinf(step.rate) else round(step.rate, 4),
                    "offered_rate": step.rate,
                    "models": {
                        model: {
                            key: metrics[key]
                            for key in (
                                "request_throughput",
                                "output_throughput",
                                "total_token_throughput",
                                "mean_ttft_ms",
                                "mean_tpot_ms",
                                "mean_e2el_ms",
                                "p99_e2el_ms",
                                "completed",
                                "failed",
                            )
                            if key in metrics
                        }
                        for model, metrics in pooled.items()
                    },
                }
            )
        result["sweep_stop_reason"] = sweep_stop_reason
    return result


def run(coroutine):
    """Run ``coroutine`` to completion on a fresh event loop."""
    return asyncio.run(coroutine)
