"""A whole load test: warm-ups, interleaved rounds at one rate or a sweep of rates, and the result dict.

The result dict is what ``--save-result`` writes and ``--json`` prints: ``models`` holds each model's
``vllm bench serve`` metrics pooled over the rounds (plus ``rounds``, the per-round metrics, and
``blocks``), ``comparison`` each variant's ratios to the baseline with the ideal speedup,
``fraction_of_ideal_speedup``, their 95 % intervals and a ``verdict``, ``aa`` the A/A control's ratios (with
``--aa``), ``rounds`` and ``precision`` how long the measurement ran and how precise it got, ``steady`` the
same at a fixed Poisson rate below saturation, and with a sweep ``sweep`` holds one entry per rate step.
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

from ground.planning.devices import cpu_model
from loadtest.client import RequestResult
from loadtest.compare import BlockCounts, aa_entry, comparison_entry, ratio_estimates
from loadtest.config import LoadConfig
from loadtest.metrics import compute_metrics
from loadtest.prompts import Prompt
from loadtest.runner import RoundPrompts, RunResult, interleaved_rounds, make_client, run_round, warm_up

AA_ARM_SUFFIX = " (A/A)"
"""The A/A arm is named after the baseline plus this: ``dense (A/A)``."""


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
        from ground.core.errors import UserError

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
    return f"{cpu_model()}, {os.cpu_count()} logical cores, {platform.system()} {platform.release()}"


class Benchmark:
    """Measures several models of one or more servers under identical load."""

    def __init__(
        self,
        targets: dict[str, str],
        config: LoadConfig,
        *,
        api_key: str | None = None,
        progress: Callable[[str, int], object] | None = None,
        model_names: dict[str, str] | None = None,
    ):
        """Args:
        targets: ``arm -> base URL``; the first arm is the default baseline.
        config: Load settings.
        api_key: Bearer token for the servers, if they need one.
        progress: ``progress(description, total)`` returning an object with ``update()`` and ``close()``
            (a tqdm bar); None for silence.
        model_names: ``arm -> model name it sends`` for arms not named after their model (the A/A arm).
        """
        self.targets, self.config, self.api_key, self.progress = targets, config, api_key, progress
        self.model_names = model_names or {}

    def _bar(self, description: str, total: int):
        return self.progress(description, total) if self.progress else None

    async def warm_up(self, prompts: Sequence[Prompt]) -> dict[str, list[RequestResult]]:
        """Send the warm-up prompts to every model; ``model -> results``."""
        results: dict[str, list[RequestResult]] = {}
        async with make_client(self.config, self.api_key) as client:
            for arm, target in self.targets.items():
                model = self.model_names.get(arm, arm)
                results[arm] = await warm_up(client, target, model, prompts, self.config)
        return results

    async def measure(
        self, prompts_per_round: Sequence[Sequence[Prompt]], rate: float | None = None
    ) -> Measurement:
        """Interleaved rounds of every model at ``rate`` (default: the configured rate)."""
        rate = self.config.rate if rate is None else rate
        total = self.config.num_prompts * len(self.targets) * len(prompts_per_round)
        bar = self._bar(f"rate {rate:g} req/s", total)
        try:
            async with make_client(self.config, self.api_key) as client:
                runs = await interleaved_rounds(
                    client,
                    self.targets,
                    prompts_per_round,
                    self.config,
                    rate=rate,
                    model_names=self.model_names,
                    on_request_done=bar.update if bar else None,
                )
        finally:
            if bar:
                bar.close()
        return Measurement(rate=rate, runs=runs)

    async def measure_until(
        self,
        prompts_of_round: Callable[[int], RoundPrompts],
        should_stop: Callable[[dict[str, list[dict]]], str | None],
        rate: float | None = None,
    ) -> Measurement:
        """Interleaved rounds at ``rate``, one at a time, until ``should_stop(per-round metrics)`` says why.

        Args:
            prompts_of_round: The prompts of round ``i`` (drawn when the round starts).
            should_stop: Called after every round; a reason ends the measurement (``config.max_rounds``
                ends it in any case).
            rate: Request rate (default: the configured rate).
        """
        rate = self.config.rate if rate is None else rate
        measurement = Measurement(rate=rate)
        bar = self._bar(f"rate {rate:g} req/s, rounds", self.config.max_rounds)
        try:
            async with make_client(self.config, self.api_key) as client:
                for round_index in range(self.config.max_rounds):
                    measurement.runs += await run_round(
                        client,
                        self.targets,
                        prompts_of_round(round_index),
                        self.config,
                        round_index,
                        rate=rate,
                        model_names=self.model_names,
                    )
                    if bar:
                        bar.update()
                    if should_stop(measurement.per_round_metrics(self.config)):
                        break
        finally:
            if bar:
                bar.close()
        return measurement

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
    measurement: Measurement,
    config: LoadConfig,
    baseline: str,
    counts: dict[str, BlockCounts | None],
    aa_arm: str | None = None,
) -> tuple[dict, dict, dict | None]:
    """``(models, comparison, aa)`` parts of the result for one measurement (``aa`` None without the arm)."""
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
    estimates = ratio_estimates(per_round, baseline)
    aa = aa_entry(estimates.pop(aa_arm)) if aa_arm in estimates else None
    comparison = {model: comparison_entry(per_key, counts.get(model)) for model, per_key in estimates.items()}
    return models, comparison, aa


def result_header(*, target: str, targets: dict[str, str], config: LoadConfig, baseline: str, tokenizer: str):
    """What every result starts with: the tool, when, where, on what hardware, with which load settings."""
    from ground.core.version import __version__

    return {
        "tool": "depthprune loadtest",
        "depthprune_version": __version__,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "target": target,
        "targets": targets,
        "hardware": hardware_description(),
        "backend": "openai-completions (streaming)",
        "settings": config.as_dict(),
        "tokenizer": tokenizer,
        "baseline": baseline,
    }


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
    aa_arm: str | None = None,
    precision: dict | None = None,
    steady: Measurement | None = None,
    steady_precision: dict | None = None,
) -> dict:
    """The result dict of a load test (see the module docstring).

    Args:
        aa_arm: The A/A arm's name, when the baseline was measured twice.
        precision: The saturation phase's :meth:`loadtest.precision.StopRule.record`.
        steady: The measurement at the fixed steady-state rate, if one ran.
        steady_precision: Its stopping record.
    """
    models, comparison, aa = summarize_measurement(measurement, config, baseline, counts, aa_arm)
    result = result_header(
        target=target, targets=targets, config=config, baseline=baseline, tokenizer=tokenizer
    )
    result["settings"]["measured_rate"] = "inf" if math.isinf(measurement.rate) else measurement.rate
    result |= {
        "rounds": len(next(iter(models.values()))["rounds"]) if models else 0,
        "precision": precision,
        "models": models,
        "comparison": comparison,
    }
    if aa_arm:
        result["aa"] = aa
    if steady is not None:
        result["steady"] = _steady_entry(steady, config, baseline, counts, aa_arm, steady_precision)
    if sweep_steps:
        result["sweep"] = [_sweep_entry(step, config) for step in sweep_steps]
        result["sweep_stop_reason"] = sweep_stop_reason
    return result


_SWEEP_METRICS = (
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
"""The pooled metrics a sweep step keeps per model."""


def _steady_entry(
    steady: Measurement,
    config: LoadConfig,
    baseline: str,
    counts: dict[str, BlockCounts | None],
    aa_arm: str | None,
    steady_precision: dict | None,
) -> dict:
    """The result's ``steady`` part: the measurement at the fixed steady-state rate, summarised."""
    models, comparison, aa = summarize_measurement(steady, config, baseline, counts, aa_arm)
    return {
        "rate": steady.rate,
        "rounds": len(next(iter(models.values()))["rounds"]),
        "precision": steady_precision,
        "models": models,
        "comparison": comparison,
        **({"aa": aa} if aa_arm else {}),
    }


def _sweep_entry(step: Measurement, config: LoadConfig) -> dict:
    """One entry of the result's ``sweep``: the step's rate and each model's :data:`_SWEEP_METRICS`."""
    pooled = step.pooled_metrics(config)
    return {
        "rate": "inf" if math.isinf(step.rate) else round(step.rate, 4),
        "offered_rate": step.rate,
        "models": {
            model: {key: metrics[key] for key in _SWEEP_METRICS if key in metrics}
            for model, metrics in pooled.items()
        },
    }


def run(coroutine):
    """Run ``coroutine`` to completion on a fresh event loop."""
    return asyncio.run(coroutine)
