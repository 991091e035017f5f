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
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated
from urllib.parse import urlparse

import typer

from depthprune.core.errors import UserError
from depthprune.core.options import JsonOption, RegistryOption, SeedOption
from loadtest.benchmark import SweepConfig
from loadtest.capacity import CapacityConfig
from loadtest.compare import parse_blocks_overrides
from loadtest.config import LoadConfig
from loadtest.metrics import parse_goodput
from loadtest.report import markdown_report
from loadtest.session import LoadTestPlan, run_loadtest
from loadtest.slo import parse_slo


def parse_rate(text: str) -> float:
    """``"inf"`` or a positive number of requests per second."""
    try:
        rate = float(text)
    except ValueError:
        raise UserError(f"--rate must be a number of requests per second or 'inf', got {text!r}") from None
    if not rate > 0:
        raise UserError(f"--rate must be positive or inf, got {text!r}")
    return rate


def parse_latency_targets(goodput: list[str], percentiles: str) -> tuple[dict[str, float], tuple[float, ...]]:
    """``--goodput`` SLOs in ms (``{"ttft": 500.0}``) and ``--percentiles`` (``(90.0, 99.0)``).

    Raises:
        UserError: a malformed SLO or percentile.
    """
    try:
        slos = parse_goodput(goodput)
        return slos, tuple(float(p) for p in percentiles.split(",") if p.strip())
    except ValueError as error:
        raise UserError(str(error)) from None


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


@dataclass(frozen=True)
class TargetOptions:
    """Which models ``loadtest`` loads and how it reaches and sizes them, as typed on the command line."""

    models: str
    """``--models``: comma-separated models, baseline first, each optionally ``NAME@URL``."""
    blocks: list[str] | None
    """``--blocks``: ``NAME=N:M`` block counts."""
    tokenizer: Path | None
    """``--tokenizer``: model directory whose tokenizer sizes prompts."""
    api_key: str | None
    """``--api-key``: bearer token of the target."""


@dataclass(frozen=True)
class ResultOptions:
    """Where ``loadtest`` puts its result (besides standard output)."""

    registry: str | None
    """``--registry``: the registry the results are stored in."""
    save_registry: bool
    """``--save-registry``: store results as serving benchmarks of registry variants."""
    save_result: Path | None
    """``--save-result``: write the result JSON here."""
    report_dir: Path | None
    """``--report-dir``: write loadtest.md and PNG plots into this directory."""


# The options of ``loadtest`` too long to fit on one line of its signature, named here so that the signature
# reads as one line per option (the options every command shares are in ``depthprune.core.options``).
TargetOption = Annotated[
    str, typer.Option(help="Base URL of the gateway or vLLM server that serves the models.")
]
ModelsOption = Annotated[
    str,
    typer.Option(
        help="Comma-separated models, baseline (dense) first; NAME@URL sends "
        "that model's load to another server."
    ),
]
RateOption = Annotated[
    str, typer.Option(help="Requests per second, or 'inf' to send all at once (saturation).")
]
BurstinessOption = Annotated[
    float, typer.Option(help="Gamma shape of arrival gaps: 1 = Poisson, <1 burstier.")
]
MaxConcurrencyOption = Annotated[int | None, typer.Option(help="Most requests in flight (default: no cap).")]
InputLenOption = Annotated[
    int, typer.Option(help="Prompt tokens (exact for synthetic prompts, a cut for texts).")
]
OutputLenOption = Annotated[
    int, typer.Option(help="Tokens each request generates (ignore_eos keeps it exact).")
]
PromptsOption = Annotated[
    str,
    typer.Option(
        help="'synthetic', 'pydoc' (Python's documentation), 'demo' (demo model test text), "
        "or a file (JSON Lines with prompt/text, or one prompt per line)."
    ),
]
RoundsOption = Annotated[
    int, typer.Option(help="Fewest interleaved rounds; ratios are per round, so drift cancels.")
]
MaxRoundsOption = Annotated[
    int | None,
    typer.Option(help="Most rounds (default: 30 or --rounds): rounds are added until --target-precision."),
]
TargetPrecisionOption = Annotated[
    float,
    typer.Option(
        help="Wanted relative half-width of the headline 95 % intervals (speed-ups and A/A); "
        "0 = run --max-rounds."
    ),
]
TimeBudgetOption = Annotated[
    float, typer.Option(help="Seconds after which no round is added (60 % for saturation, then steady).")
]
BudgetCutsBlocksOption = Annotated[
    bool,
    typer.Option(
        "--budget-cuts-blocks",
        help="Once --rounds ran, stop at --time-budget even inside a block of the balanced arm order "
        "(the record says so); without it the budget is looked at after whole blocks only.",
    ),
]
AAOption = Annotated[
    bool,
    typer.Option("--aa", help="A/A control: measure the baseline again as its own arm (the noise floor)."),
]
SteadyFractionOption = Annotated[
    float,
    typer.Option(
        help="With --rate inf, also measure at this fraction of the baseline's saturation request rate "
        "(Poisson; steady-state TTFT and TPOT); 0 = no."
    ),
]
GoodputOption = Annotated[
    list[str] | None, typer.Option(help="SLOs for goodput in ms, e.g. 'ttft:500 tpot:50'.")
]
SweepOption = Annotated[
    bool,
    typer.Option(
        "--sweep",
        help="Step the rate up (x2) until throughput stops growing "
        "or requests fail; the last step is reported.",
    ),
]
SweepStartOption = Annotated[
    float | None, typer.Option(help="First sweep rate (default: one stream's rate).")
]
BlocksOption = Annotated[
    list[str] | None,
    typer.Option(help="NAME=N:M: N blocks of the base, M removed (overrides registry and /v1/models)."),
]
TokenizerOption = Annotated[Path | None, typer.Option(help="Model directory whose tokenizer sizes prompts.")]
MaxRunTimeOption = Annotated[float, typer.Option(help="Seconds one model's run may take in one round.")]
ApiKeyOption = Annotated[
    str | None, typer.Option(envvar="DEPTHPRUNE_API_KEY", help="Bearer token of the target.")
]
SaveRegistryOption = Annotated[
    bool, typer.Option(help="Store results as serving benchmarks of registry variants.")
]
ReportDirOption = Annotated[
    Path | None, typer.Option(help="Write loadtest.md and PNG plots into this directory.")
]
StopRuleOption = Annotated[
    str,
    typer.Option(
        help="precision: add rounds until every headline interval is --target-precision precise; decision: "
        "stop as soon as every variant's interval excludes 1 and the A/A one is within ±--aa-tolerance."
    ),
]
AaToleranceOption = Annotated[
    float, typer.Option(help="--stop-rule decision: how close to 1 the A/A interval must lie (0.05 = ±5 %).")
]
SloOption = Annotated[
    str | None,
    typer.Option(
        help="Capacity at these latency objectives instead of saturation, e.g. "
        "'ttft_p99_ms=500,tpot_p99_ms=50[,e2e_p99_ms=4000]': each arm's highest Poisson rate meeting all."
    ),
]
SloReplicatesOption = Annotated[
    int, typer.Option(help="With --slo: most repeats of the whole rate search (intervals come from them).")
]
SloStartOption = Annotated[
    float | None,
    typer.Option(help="With --slo: first rate tried (default: half each arm's throughput in a short burst)."),
]
ArmGapOption = Annotated[
    float,
    typer.Option(
        help="Seconds to pause before an arm's run when the run before it sent another model, so that "
        "engine is idle first (0 = none; docs/benchmarks.md).",
    ),
]
SettleOption = Annotated[
    int, typer.Option(help="Unmeasured short requests to an arm right before each of its runs.")
]

LOAD_OPTION_FIELDS = {
    "arm_gap": "arm_gap_s",
    "time_budget": "time_budget_s",
    "request_timeout": "request_timeout_s",
    "max_run_time": "max_run_s",
}
"""``loadtest`` parameter -> :class:`LoadConfig` field, where the names differ (the rest are equal)."""


def load_config(options: dict) -> LoadConfig:
    """The :class:`LoadConfig` of ``loadtest``'s parameters (``options``: its ``locals()``)."""
    fields = {LOAD_OPTION_FIELDS.get(name, name): value for name, value in options.items()}
    slos, percentiles = parse_latency_targets(options["goodput"] or [], options["percentiles"])
    fields.update(rate=parse_rate(options["rate"]), goodput_slos_ms=slos, percentiles=percentiles)
    return LoadConfig(**{name: fields[name] for name in LoadConfig.__dataclass_fields__})


def loadtest(
    target: TargetOption = "http://127.0.0.1:8000",
    models: ModelsOption = "dense",
    rate: RateOption = "inf",
    burstiness: BurstinessOption = 1.0,
    max_concurrency: MaxConcurrencyOption = None,
    num_prompts: Annotated[int, typer.Option(help="Measured requests per model and round.")] = 64,
    input_len: InputLenOption = 128,
    output_len: OutputLenOption = 64,
    warmup: Annotated[int, typer.Option(help="Unmeasured warm-up requests per model.")] = 2,
    settle_requests: SettleOption = 2,
    arm_gap: ArmGapOption = 2.0,
    seed: SeedOption = 0,
    prompts: PromptsOption = "synthetic",
    rounds: RoundsOption = 3,
    max_rounds: MaxRoundsOption = None,
    target_precision: TargetPrecisionOption = 0.03,
    stop_rule: StopRuleOption = "precision",
    aa_tolerance: AaToleranceOption = 0.05,
    time_budget: TimeBudgetOption = 600.0,
    budget_cuts_blocks: BudgetCutsBlocksOption = False,
    aa: AAOption = False,
    steady_fraction: SteadyFractionOption = 0.5,
    goodput: GoodputOption = None,
    percentiles: Annotated[str, typer.Option(help="Comma-separated latency percentiles.")] = "90,99",
    slo: SloOption = None,
    slo_replicates: SloReplicatesOption = 4,
    slo_start_rate: SloStartOption = None,
    sweep: SweepOption = False,
    sweep_start: SweepStartOption = None,
    sweep_steps: Annotated[int, typer.Option(help="Most rates a sweep tries.")] = 8,
    blocks: BlocksOption = None,
    tokenizer: TokenizerOption = None,
    ignore_eos: Annotated[bool, typer.Option(help="Generate exactly --output-len tokens.")] = True,
    request_timeout: Annotated[float, typer.Option(help="Seconds before one request fails.")] = 300.0,
    max_run_time: MaxRunTimeOption = 1800.0,
    api_key: ApiKeyOption = None,
    registry: RegistryOption = None,
    save_registry: SaveRegistryOption = True,
    save_result: Annotated[Path | None, typer.Option(help="Write the result JSON here.")] = None,
    report_dir: ReportDirOption = None,
    as_json: JsonOption = False,
) -> None:
    """Measure latency and throughput of each model (dense first) under identical streaming load.

    Sends OpenAI completion requests with ignore_eos so every model generates the same tokens, times every
    streamed token, and reports TTFT, TPOT, ITL and E2E latency (mean, median, std, percentiles), request and
    token throughput and goodput with the key names of `vllm bench serve`; then each variant's ratio to the
    dense model, with its 95 % interval, next to the ideal N/(N-M) speedup of removing M of N blocks. With
    --slo: each model's capacity (highest Poisson rate meeting every objective) and its ratio to dense.
    """
    config = load_config(dict(locals()))
    target = check_url(target, "--target")
    if slo is not None and sweep:
        raise UserError("--slo and --sweep are two different searches: give one")
    capacity = None
    if slo is not None:
        capacity = CapacityConfig(parse_slo(slo), start_rate=slo_start_rate, max_replicates=slo_replicates)
    sweep_config = SweepConfig(start_rate=sweep_start, max_steps=sweep_steps) if sweep else None
    outputs = ResultOptions(registry, save_registry, save_result, report_dir)
    targets = TargetOptions(models, blocks, tokenizer, api_key)
    plan = _plan(target, config, sweep_config, capacity, targets, outputs)
    result = run_loadtest(plan)
    typer.echo(json.dumps(result, indent=2) if as_json else markdown_report(result))


def _plan(
    target: str,
    config: LoadConfig,
    sweep: SweepConfig | None,
    capacity: CapacityConfig | None,
    targets: TargetOptions,
    outputs: ResultOptions,
) -> LoadTestPlan:
    """The :class:`~loadtest.session.LoadTestPlan` of one command line (parses ``--models``, ``--blocks``)."""
    return LoadTestPlan(
        target=target,
        config=config,
        sweep=sweep,
        capacity=capacity,
        targets=parse_models(targets.models, target),
        blocks_overrides=parse_blocks_overrides(targets.blocks or []),
        tokenizer_dir=targets.tokenizer,
        api_key=targets.api_key,
        registry_url=outputs.registry,
        save_registry=outputs.save_registry,
        save_result=outputs.save_result,
        report_dir=outputs.report_dir,
    )
