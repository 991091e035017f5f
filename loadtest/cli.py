"""``depthprune loadtest``: latency and throughput of each variant next to the dense model.

Example (gateway on port 8000 serving ``dense`` and ``ppl-best``; an A/A control, rounds added until the
intervals are ±3 %)::

    depthprune loadtest --target http://127.0.0.1:8000 --models dense,ppl-best --aa \\
        --num-prompts 64 --output-len 64 --report-dir reports/ --save-result result.json

Capacity at a latency objective (each arm's highest Poisson rate meeting every objective,
:mod:`loadtest.capacity`)::

    depthprune loadtest --models dense,ppl-best --aa --slo "ttft_p99_ms=500,tpot_p99_ms=50" --time-budget 900
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import typer

from ground.core.cli_options import cli, option_group, with_options
from ground.core.errors import UserError
from ground.core.options import JsonOptions, RegistryOptions
from loadtest.benchmark import SweepConfig
from loadtest.capacity import CapacityConfig
from loadtest.compare import parse_blocks_overrides
from loadtest.config import LoadConfig
from loadtest.report import markdown_report
from loadtest.session import LoadTestPlan, run_loadtest
from loadtest.slo import parse_slo


def check_url(url: str, option: str) -> str:
    """``url`` without a trailing slash when it is ``http(s)://host[:port]``; UserError otherwise."""
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise UserError(f"{option} {url!r} is not an http(s)://host:port URL")
    return url.rstrip("/")


def parse_models(spec: str, target: str) -> dict[str, str]:
    """``"dense,ppl-best"`` or ``"dense@http://h:8001,v@http://h:8002"`` -> ``{model: base URL}``."""
    targets: dict[str, str] = {}
    for item in (part.strip() for part in spec.split(",")):
        if not item:
            continue
        name, sep, url = item.partition("@")
        if name in targets:
            raise UserError(f"--models lists {name!r} twice")
        targets[name] = check_url(url, f"--models {name}@") if sep else target
    if not targets:
        raise UserError("--models names no model (e.g. --models dense,ppl-best)")
    return targets


@option_group
@dataclass(frozen=True)
class TargetOptions:
    """Which models ``loadtest`` loads and how it reaches and sizes them, as typed on the command line."""

    target: str = "http://127.0.0.1:8000"
    """Base URL of the gateway or vLLM server that serves the models."""
    models: str = "dense"
    """Comma-separated models, baseline (dense) first; NAME@URL sends that model's load to another server."""
    blocks: list[str] | None = None
    """NAME=N:M: N blocks of the base, M removed (overrides registry and /v1/models)."""
    tokenizer: Path | None = None
    """Model directory whose tokenizer sizes prompts."""
    api_key: str | None = field(default=None, metadata=cli(envvar="DEPTHPRUNE_API_KEY"))
    """Bearer token of the target."""


@option_group
@dataclass(frozen=True)
class SearchOptions:
    """The two searches over the request rate ``loadtest`` can run instead of one saturation run."""

    slo: str | None = None
    """Capacity at these latency objectives instead of saturation, e.g.
    'ttft_p99_ms=500,tpot_p99_ms=50[,e2e_p99_ms=4000]': each arm's highest Poisson rate meeting all."""
    slo_replicates: int = 4
    """With --slo: most repeats of the whole rate search (intervals come from them)."""
    slo_start_rate: float | None = None
    """With --slo: first rate tried (default: half each arm's throughput in a short burst)."""
    sweep: bool = field(default=False, metadata=cli("--sweep"))
    """Step the rate up (x2) until throughput stops growing or requests fail; the last step is reported."""
    sweep_start: float | None = None
    """First sweep rate (default: one stream's rate)."""
    sweep_steps: int = 8
    """Most rates a sweep tries."""

    def capacity(self) -> CapacityConfig | None:
        """The capacity search of ``--slo``, or None."""
        if self.slo is not None and self.sweep:
            raise UserError("--slo and --sweep are two different searches: give one")
        if self.slo is None:
            return None
        return CapacityConfig(
            parse_slo(self.slo), start_rate=self.slo_start_rate, max_replicates=self.slo_replicates
        )

    def sweep_config(self) -> SweepConfig | None:
        """The rate sweep of ``--sweep``, or None."""
        return SweepConfig(start_rate=self.sweep_start, max_steps=self.sweep_steps) if self.sweep else None


@option_group
@dataclass(frozen=True)
class ResultOptions:
    """Where ``loadtest`` puts its result (besides standard output)."""

    save_registry: bool = True
    """Store results as serving benchmarks of registry variants."""
    save_result: Path | None = None
    """Write the result JSON here."""
    report_dir: Path | None = None
    """Write loadtest.md and PNG plots into this directory."""


@with_options
def loadtest(
    targets: TargetOptions,
    config: LoadConfig,
    search: SearchOptions,
    outputs: ResultOptions,
    registry: RegistryOptions,
    output: JsonOptions,
) -> None:
    """Measure latency and throughput of each model (dense first) under identical streaming load.

    Sends OpenAI completion requests with ignore_eos so every model generates the same tokens, times every
    streamed token, and reports TTFT, TPOT, ITL and E2E latency (mean, median, std, percentiles), request and
    token throughput and goodput with the key names of `vllm bench serve`; then each variant's ratio to the
    dense model, with its 95 % interval, next to the ideal N/(N-M) speedup of removing M of N blocks. With
    --slo: each model's capacity (highest Poisson rate meeting every objective) and its ratio to dense.
    """
    target = check_url(targets.target, "--target")
    capacity = search.capacity()
    plan = _plan(target, config, (search.sweep_config(), capacity), targets, outputs, registry.registry)
    result = run_loadtest(plan)
    typer.echo(json.dumps(result, indent=2) if output.as_json else markdown_report(result))


def _plan(
    target: str,
    config: LoadConfig,
    searches: tuple[SweepConfig | None, CapacityConfig | None],
    targets: TargetOptions,
    outputs: ResultOptions,
    registry_url: str | None,
) -> LoadTestPlan:
    """The :class:`~loadtest.session.LoadTestPlan` of one command line (parses ``--models``, ``--blocks``)."""
    return LoadTestPlan(
        target=target,
        config=config,
        sweep=searches[0],
        capacity=searches[1],
        targets=parse_models(targets.models, target),
        blocks_overrides=parse_blocks_overrides(targets.blocks or []),
        tokenizer_dir=targets.tokenizer,
        api_key=targets.api_key,
        registry_url=registry_url,
        save_registry=outputs.save_registry,
        save_result=outputs.save_result,
        report_dir=outputs.report_dir,
    )
