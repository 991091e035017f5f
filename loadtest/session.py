"""One load-test session, as ``depthprune loadtest`` runs it: a :class:`LoadTestPlan` in, a result dict out.

:func:`run_loadtest` checks that every target serves its model, counts each model's blocks, picks the
tokenizer that sizes the prompts, warms every model up, measures them (interleaved rounds at one rate, or a
rate sweep), then stores the result in the registry and writes ``--save-result`` and ``--report-dir``.

The measurement (:func:`measure`): interleaved rounds at saturation (with ``--aa`` the baseline also runs
as its own second arm), added one by one until the headline intervals are ``--target-precision`` precise
(:mod:`loadtest.precision`); then, unless ``--steady-fraction 0``, the same at a fixed Poisson rate below
saturation, where TTFT and TPOT are steady-state. Every arm gets prompts of its own in every round
(tagged, :func:`loadtest.prompts.build_prompts`), so no arm is served from another's prefix cache.
The command line (``loadtest.cli``) only parses options into the plan and prints the result::

    from loadtest.config import LoadConfig
    from loadtest.session import LoadTestPlan, run_loadtest

    plan = LoadTestPlan(
        target="http://127.0.0.1:8000",
        targets={"dense": "http://127.0.0.1:8000", "ppl-best": "http://127.0.0.1:8000"},
        config=LoadConfig(num_prompts=64, output_len=64, rounds=3),
    )
    result = run_loadtest(plan)
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

from ground.core.errors import UserError
from loadtest.benchmark import AA_ARM_SUFFIX, Benchmark, SweepConfig, build_result, result_header, run
from loadtest.blocks import block_counts
from loadtest.capacity import CapacityConfig, CapacitySearch, search_capacity
from loadtest.capacity_stats import capacity_section
from loadtest.client import RequestResult, served_models
from loadtest.compare import BlockCounts, attach_acceptance, spec_decode_snapshot
from loadtest.config import LoadConfig
from loadtest.precision import StopRule
from loadtest.prompts import (
    PROMPT_SOURCES,
    HFTokenizer,
    Prompt,
    ServerTokenizer,
    WordTokenizer,
    build_prompts,
)
from loadtest.report import write_report

__all__ = ["LoadTestPlan", "run_loadtest"]

STEADY_BUDGET_SPLIT = 0.6
"""Share of ``--time-budget`` the saturation phase may use when a steady-state phase follows."""
REPORT_RESERVE_S = 15.0
"""Seconds of ``--time-budget`` the capacity search leaves for the result and its plots."""


@dataclass
class LoadTestPlan:
    """Everything one load test needs: where the load goes, which load, and where the results go."""

    target: str
    """Base URL of the gateway or vLLM server (``--target``), as the result reports it."""
    targets: dict[str, str]
    """``model -> base URL`` its load is sent to; the first model is the baseline."""
    config: LoadConfig
    """The load every model gets."""
    sweep: SweepConfig | None = None
    """Step the rate up to saturation instead of measuring at ``config.rate``; None = one rate."""
    capacity: CapacityConfig | None = None
    """``--slo``: search each arm's capacity at the objectives instead (:mod:`loadtest.capacity`)."""
    blocks_overrides: dict[str, BlockCounts] = field(default_factory=dict)
    """``--blocks``: block counts that override the registry's and ``/v1/models``'."""
    tokenizer_dir: Path | None = None
    """Model directory whose tokenizer sizes the prompts; None = the best one found."""
    api_key: str | None = None
    """Bearer token of the targets."""
    registry_url: str | None = None
    """Registry given with ``--registry``; None = the default one (used only to store results)."""
    save_registry: bool = True
    """Store each model's metrics as a serving benchmark of its registry variant."""
    save_result: Path | None = None
    """Write the result JSON to this file."""
    report_dir: Path | None = None
    """Write ``loadtest.md`` and PNG plots into this directory."""

    def __post_init__(self):
        prompts = self.config.prompts
        if prompts not in PROMPT_SOURCES and not Path(prompts).is_file():
            raise UserError(
                f"--prompts {prompts!r} is neither {', '.join(PROMPT_SOURCES)} nor an existing file"
            )
        for path, option in ((self.save_result, "--save-result"), (self.report_dir, "--report-dir")):
            wants_directory = option == "--report-dir"
            if path is not None and path.exists() and (path.is_dir() != wants_directory):
                raise UserError(
                    f"{option} {path} exists and is not a {'directory' if wants_directory else 'file'}"
                )

    @property
    def baseline(self) -> str:
        """The model every other is compared with (the first one)."""
        return next(iter(self.targets))

    @property
    def aa_arm(self) -> str | None:
        """The A/A arm's name (``dense (A/A)``) with ``config.aa``, else None."""
        return self.baseline + AA_ARM_SUFFIX if self.config.aa else None

    @property
    def arms(self) -> dict[str, str]:
        """``arm -> base URL``: the targets, then the A/A arm (the baseline's URL) with ``config.aa``."""
        if self.aa_arm is None:
            return dict(self.targets)
        return {**self.targets, self.aa_arm: self.targets[self.baseline]}


def run_loadtest(plan: LoadTestPlan) -> dict:
    """Measure every model of ``plan`` under identical streaming load and compare each with the baseline.

    Args:
        plan: targets, load, and where to store and write the result.

    Returns:
        The result dict (see ``loadtest.benchmark``), plus ``registry`` (model -> stored or why not) when
        results were stored, and ``report_files`` when a report was written.

    Raises:
        UserError: a target that is unreachable or does not serve its model, or a model whose every
            warm-up request failed.
    """
    config = plan.config
    started = time.monotonic()
    cards = check_models_served(plan.targets, plan.api_key)
    registry = open_registry_or_none(plan.registry_url, plan.save_registry or plan.registry_url is not None)
    counts = block_counts(
        list(plan.targets), cards, plan.blocks_overrides, registry if plan.registry_url else None
    )
    tokenizer = choose_tokenizer(plan.tokenizer_dir, plan.targets, cards, registry, plan.api_key)
    if plan.aa_arm:
        counts[plan.aa_arm] = counts.get(plan.baseline)
    for model, card in cards.items():
        if card.get("speculative"):  # dense with a draft: no N/(N-M) ceiling, its speed-up is the draft's
            counts[model] = None

    from tqdm import tqdm

    benchmark = Benchmark(
        plan.arms,
        config,
        api_key=plan.api_key,
        progress=lambda description, total: tqdm(total=total, desc=description, unit="", leave=False),
        model_names={plan.aa_arm: plan.baseline} if plan.aa_arm else None,
    )
    warm = warm_up(
        benchmark,
        build_prompts(config.prompts, config.warmup, config.input_len, tokenizer, config.seed, "w")
        if config.warmup
        else [],
    )
    prompts = RoundPromptPlan(config, tokenizer, list(plan.arms))
    spec_before = spec_decode_snapshot(plan.targets, plan.api_key)  # speculative arms, after the warm-up
    common = dict(
        target=plan.target,
        targets=plan.arms,
        config=config,
        baseline=plan.baseline,
        counts=counts,
        tokenizer=tokenizer.description,
        aa_arm=plan.aa_arm,
    )
    if plan.capacity is not None:
        result = measure_capacity(benchmark, plan, prompts, warm, common, started)
    elif plan.sweep is not None:
        first_rate = plan.sweep.start_rate or _single_stream_rate(warm.get(plan.baseline, []), config)
        per_round = [prompts.of_round("s", r) for r in range(config.rounds)]
        steps, stop_reason = run(benchmark.sweep(per_round, plan.sweep, plan.baseline, first_rate))
        clean = [step for step in steps if not step.failed()]
        result = build_result(
            **common,
            measurement=clean[-1] if clean else steps[-1],
            sweep_steps=steps,
            sweep_stop_reason=stop_reason,
        )
    else:
        result = build_result(**common, **measure(benchmark, plan, prompts))
    attach_acceptance(result, spec_before, spec_decode_snapshot(plan.targets, plan.api_key))
    if registry is not None and plan.save_registry:
        result["registry"] = store_in_registry(registry, result)
    write_outputs(result, plan.save_result, plan.report_dir)
    return result


def check_models_served(targets: dict[str, str], api_key: str | None) -> dict[str, dict]:
    """``model -> /v1/models entry``; UserError for an unreachable target or a model it does not serve."""
    cards: dict[str, dict] = {}
    listings: dict[str, dict[str, dict]] = {}
    for model, target in targets.items():
        if target not in listings:
            listings[target] = served_models(target, api_key=api_key)
        listing = listings[target]
        by_alias = {alias: card for card in listing.values() for alias in card.get("aliases") or []}
        card = listing.get(model) or by_alias.get(model)
        if card is None:
            raise UserError(
                f"{target} does not serve {model!r}; it serves: {', '.join(sorted(listing)) or 'nothing'}"
            )
        cards[model] = card
    return cards


def choose_tokenizer(
    tokenizer_dir: Path | None, targets: dict[str, str], cards: dict[str, dict], registry, api_key: str | None
):
    """The best tokenizer for prompts (see ``loadtest.prompts``)."""
    if tokenizer_dir is not None:
        if not tokenizer_dir.is_dir():
            raise UserError(f"--tokenizer {tokenizer_dir} is not a directory")
        return HFTokenizer(tokenizer_dir)
    first = next(iter(targets))
    local_dirs = [cards[first].get("root")]
    if registry is not None:
        try:
            local_dirs.insert(0, registry.resolve(first).checkpoint_path)
        except (UserError, AttributeError):
            pass
    for directory in local_dirs:
        if directory and (Path(directory) / "config.json").is_file():
            try:
                return HFTokenizer(directory)
            except (OSError, ValueError):
                continue
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    return ServerTokenizer.probe(targets[first], first, headers) or WordTokenizer()


def open_registry_or_none(url: str | None, enabled: bool):
    """The registry (``--registry`` or the default), or None when disabled or not installed."""
    if not enabled:
        return None
    try:
        from registry import open_registry
    except ImportError:
        if url:
            raise UserError("--registry was given but the registry package is not installed") from None
        return None
    return open_registry(url)


@dataclass
class RoundPromptPlan:
    """The prompts of every arm in every round, drawn when the round starts (rounds are open-ended).

    In one round every arm gets the same texts (the same draw) but its own tag, so the arms do equal work
    and none is served from the prefix cache another filled; every round draws new texts.
    """

    config: LoadConfig
    """Prompt source, lengths, count and seed."""
    tokenizer: object
    """Sizes the prompts (see :mod:`loadtest.prompts`)."""
    arms: list[str]
    """The arms, in the user's order (their index is in the tag)."""

    def of_round(self, phase: str, round_index: int) -> dict[str, list[Prompt]]:
        """``arm -> prompts`` of round ``round_index`` of ``phase`` (``s`` saturation, ``p`` Poisson)."""
        config = self.config
        seed = config.seed * 100_003 + round_index * 2 + (phase == "p")
        return {
            arm: build_prompts(
                config.prompts,
                config.num_prompts,
                config.input_len,
                self.tokenizer,
                seed,
                tag=f"{phase}{round_index}.{index}",
            )
            for index, arm in enumerate(self.arms)
        }


def measure(benchmark: Benchmark, plan: LoadTestPlan, prompts: RoundPromptPlan) -> dict:
    """Saturation rounds until precise, then steady-state rounds; the matching :func:`build_result` arguments.

    Returns:
        ``measurement`` and ``precision`` (saturation at ``config.rate``), and ``steady`` and
        ``steady_precision`` when a steady-state phase ran (``config.rate`` inf and ``steady_fraction`` > 0).
    """
    config = plan.config
    steady = math.isinf(config.rate) and config.steady_fraction > 0
    started = time.monotonic()
    # With a steady-state phase, saturation may add rounds for 60 % of the budget and the steady phase
    # until the end of it (each phase gets its ``rounds`` in any case).
    share = STEADY_BUDGET_SPLIT if steady else 1.0
    arms = tuple(plan.arms)
    deadline = started + share * config.time_budget_s
    rule = StopRule(config, plan.baseline, "output_throughput", deadline, arms=arms, aa_arm=plan.aa_arm)
    measurement = run(benchmark.measure_until(lambda r: prompts.of_round("s", r), rule))
    outcome = {"measurement": measurement, "precision": rule.record()}
    if steady:
        saturated = measurement.pooled_metrics(config)[plan.baseline]["request_throughput"]
        deadline = started + config.time_budget_s
        steady_rule = StopRule(config, plan.baseline, "mean_tpot_ms", deadline, arms=arms, aa_arm=plan.aa_arm)
        outcome["steady"] = run(
            benchmark.measure_until(
                lambda r: prompts.of_round("p", r), steady_rule, rate=config.steady_fraction * saturated
            )
        )
        outcome["steady_precision"] = steady_rule.record()
    return outcome


def measure_capacity(
    benchmark: Benchmark,
    plan: LoadTestPlan,
    prompts: RoundPromptPlan,
    warm: dict[str, list[RequestResult]],
    common: dict,
    started: float,
) -> dict:
    """The capacity search of ``plan.capacity`` (:mod:`loadtest.capacity`) and its result dict.

    The search must end ``--time-budget`` seconds after ``started`` (the command's start), less
    :data:`REPORT_RESERVE_S` for the report.
    """
    capacity = plan.capacity
    search = CapacitySearch(capacity, _single_stream_rate(warm.get(plan.baseline, []), plan.config))
    reserve = min(REPORT_RESERVE_S, plan.config.time_budget_s / 10)
    deadline = started + plan.config.time_budget_s - reserve

    def prompts_of_step(replicate: int, step: int) -> dict[str, list[Prompt]]:
        return prompts.of_round(f"c{replicate}.", step)

    run(search_capacity(benchmark, prompts_of_step, search, deadline))
    header_keys = ("target", "targets", "config", "baseline", "tokenizer")
    result = result_header(**{key: common[key] for key in header_keys})
    result["capacity"] = capacity_section(search, plan.baseline, common["counts"], plan.aa_arm)
    return result


def warm_up(benchmark: Benchmark, prompts: list[Prompt]) -> dict[str, list[RequestResult]]:
    """Send the warm-up requests; a model whose every warm-up request failed is a UserError."""
    warm = run(benchmark.warm_up(prompts)) if prompts else {}
    for model, results in warm.items():
        failures = [result for result in results if not result.success]
        if failures and len(failures) == len(results):
            raise UserError(
                f"every warm-up request to {model!r} failed: {failures[0].error_kind}: {failures[0].error}"
            )
    return warm


def store_in_registry(registry, result: dict) -> dict[str, str]:
    """Add each model's metrics as a serving benchmark; ``model -> "stored" | reason not stored``."""
    outcome: dict[str, str] = {}
    settings = {
        **result["settings"],
        "target": result["target"],
        "baseline": result["baseline"],
        "tokenizer": result["tokenizer"],
        "models": list(result["targets"]),
    }
    if "capacity" in result:
        settings["slo"] = result["capacity"]["slo"]
    per_model = result.get("models") or result.get("capacity", {}).get("arms", {})
    for model, metrics in per_model.items():
        if model.endswith(AA_ARM_SUFFIX):
            outcome[model] = "the A/A control (not stored)"
            continue
        try:
            registry.resolve(model)
        except UserError:
            outcome[model] = "not in the registry"
            continue
        stored = {key: value for key, value in metrics.items() if key != "rounds"}
        stored.update(result.get("comparison", {}).get(model, {}))
        registry.add_serving_benchmark(model, settings=settings, metrics=stored, hardware=result["hardware"])
        outcome[model] = "stored"
    return outcome


def write_outputs(result: dict, save_result: Path | None, report_dir: Path | None) -> None:
    """Write the result JSON and the report; the report's files are listed in ``result["report_files"]``."""
    if save_result is not None:
        save_result.parent.mkdir(parents=True, exist_ok=True)
        save_result.write_text(json.dumps(result, indent=2))
    if report_dir is not None:
        result["report_files"] = [str(path) for path in write_report(result, report_dir)]


def _single_stream_rate(warmup_results, config) -> float:
    """Requests per second of one stream, from the warm-up latencies (or 1 req/s without them)."""
    latencies = [result.latency for result in warmup_results if result.success and result.latency > 0]
    if not latencies:
        return 1.0
    return 1.0 / (sum(latencies) / len(latencies))
