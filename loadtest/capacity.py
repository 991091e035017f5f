"""Capacity at a latency objective: per arm, the highest Poisson request rate at which every SLO holds.

``depthprune loadtest --slo "ttft_p99_ms=500,tpot_p99_ms=50"`` runs this instead of the saturation rounds.
Each arm (dense, its A/A arm, each variant) has its own rate search (:class:`loadtest.bracket.Bracket`), and
the arms take their steps **interleaved, within every step**: step ``k`` runs every arm whose search is still
open at its own next rate, cut into slices of at most ``slice_seconds`` of arrivals, and the arms take turns
slice by slice (``A1 B1 C1 A2 B2 C2 ...``), each turn in the next row of the balanced order the saturation
test uses (:mod:`loadtest.order`), with the same pause and settling requests between engines
(:func:`loadtest.runner.run_round`). An arm's step is all its slices together (one SLO verdict over all their
requests). Why slices: a p99 step holds 500 requests, minutes at a low rate, so arms run one after the other
within a step were minutes apart, and under a neighbour's load the drift between them decided the steps: an
A/A arm read 0.69 [0.53, 0.90]. A slice starts with an idle engine and ends when its last request does,
alike for every arm. Each slice is open loop: Poisson arrivals (``--burstiness`` shapes them) at the
requested rate, fresh prompts tagged per arm.

**Requests per step: enough for the percentile the SLO names.** A step's p99 over 16 requests is its slowest
request, so one stalled request decides the step. A step sends at least ``tail_requests / (1 - p/100)``
requests for the highest percentile ``p`` of the SLO (5 requests at or above it: 50 for p90, 100 for p95,
500 for p99), and at least ``rate x step_seconds``, at most ``--num-prompts``; when ``--num-prompts`` caps a
step below what its percentile needs, the result says so (``percentile_support``).

**Where the search starts: a saturation probe.** Before the first replicate every arm gets one burst of
``probe_requests`` requests at once (interleaved like a step); its request throughput bounds what any
latency objective can allow, and the arm's search starts at ``start_fraction`` (half) of it. Starting from
one request stream's rate instead spent most of a 900-second budget expanding upwards through long
low-rate steps. The lowest rate tried stays a quarter of one stream's rate (1 / warm-up latency), where
requests barely overlap: a miss there is capacity 0 at this SLO.

A step records the requested and the achieved rate (requests sent / seconds from the schedule's start to
the last send) and the arrival lag (send time - due time, p50/p99/max). When the achieved rate falls more
than ``client_shortfall`` (10 %) short of the requested one, the *client* was the bottleneck: the step does
not count, and the search does not go at or above that rate.

**Replicates.** The whole search runs again, ``max_replicates`` times or until ``--time-budget`` would be
overrun: each replicate is an independent repetition with new prompts and arrival times, started near the
previous replicate's capacity (dithered by up to half the resolution, so replicates do not land on one grid)
with a step of ``1 + resolution``, so a later replicate usually ends in two or three steps. Replicate ``r``
gives every arm a capacity and every arm a paired ratio to the baseline
(the arms were measured interleaved, step by step, so slow drift of the machine hits all arms alike);
:mod:`loadtest.capacity_stats` turns the replicates into intervals. A replicate is not started when three
steps at the last capacities would overrun the budget, and no step is started that would: a replicate cut
that way is kept in the JSON, marked incomplete, and not counted. Every arm steps in every replicate until
its own search is over, and only complete replicates count, so every arm has the same number of replicates.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from ground.core.errors import UserError
from loadtest.bracket import Bracket
from loadtest.metrics import compute_metrics
from loadtest.prompts import Prompt
from loadtest.runner import RunResult, make_client, run_round
from loadtest.slo import Slo

STEP_PERCENTILES = (50.0, 90.0, 99.0)
"""Percentiles every step records of TTFT, TPOT, ITL and E2E (plus any the SLO names)."""


@dataclass
class CapacityConfig:
    """How ``--slo`` searches each arm's capacity."""

    slo: Slo
    """The objectives every counted step is judged by."""
    start_rate: float | None = None
    """First rate of the first replicate, req/s, every arm; None = ``start_fraction`` of each arm's probe."""
    start_fraction: float = 0.5
    """The first replicate starts at this fraction of the arm's saturation throughput (the probe)."""
    probe_requests: int = 32
    """Requests of the saturation probe's burst, per arm (at most ``--num-prompts``)."""
    factor: float | None = None
    """Expansion step of the first replicate (later ones step by ``1 + resolution``); None = ``(1 +
    resolution) ** 4`` (1.46): from a bracket one factor wide, two bisections reach the resolution, so a
    first replicate that starts within a factor of its capacity ends in about four steps (a factor of 2
    needs three bisections)."""
    resolution: float = 0.1
    """A replicate's search ends when its bracket is this tight (high / low <= 1 + resolution)."""
    floor_fraction: float = 0.25
    """The lowest rate tried is this fraction of one request stream's rate; a miss there is capacity 0."""
    step_seconds: float = 10.0
    """A step sends at least ``rate x step_seconds`` requests (see :func:`step_requests`)."""
    min_step_requests: int = 16
    """Fewest requests per step, whatever the percentile."""
    tail_requests: int = 5
    """A step has at least this many requests at or above the SLO's highest percentile."""
    max_replicates: int = 4
    """Most replicates of the whole search (the time budget may end it sooner)."""
    client_shortfall: float = 0.10
    """A step whose achieved rate is more than this fraction below the requested one does not count."""
    max_steps: int = 12
    """Most steps of one arm in one replicate."""
    slice_seconds: float = 10.0
    """Arms take turns within a step in slices of at most this many seconds of arrivals (module docstring):
    drift slower than one turn of every arm falls on all arms alike."""

    def __post_init__(self):
        if self.factor is None:
            self.factor = (1 + self.resolution) ** 4
        if self.start_rate is not None and not (0 < self.start_rate < math.inf):
            raise UserError(f"--slo-start-rate must be a positive number of req/s, got {self.start_rate}")
        if not 1 <= self.max_replicates <= 50:
            raise UserError(f"--slo-replicates must be in 1..50, got {self.max_replicates}")
        if not 0 < self.resolution < 1:
            raise UserError(f"the capacity resolution must be in (0, 1), got {self.resolution}")
        if (
            self.factor <= 1
            or not 0 < self.floor_fraction <= 1
            or min(self.step_seconds, self.slice_seconds) <= 0
        ):
            raise UserError(
                "the capacity factor must be above 1, the floor in (0, 1], the step and slice times positive"
            )
        if self.min_step_requests < 1 or not 0 < self.client_shortfall < 1:
            raise UserError("the capacity search needs at least 1 request per step and a shortfall in (0, 1)")
        if self.tail_requests < 1 or self.probe_requests < 1 or not 0 < self.start_fraction <= 1:
            raise UserError("the capacity search needs tail and probe requests >= 1, a start in (0, 1]")

    def percentiles(self) -> tuple[float, ...]:
        """The percentiles each step records."""
        return tuple(sorted(set(STEP_PERCENTILES) | set(self.slo.percentiles)))

    def percentile_requests(self) -> int:
        """Requests a step needs so that ``tail_requests`` of them lie at or above the SLO's highest
        percentile: ``tail_requests / (1 - p/100)`` (50 for p90, 500 for p99)."""
        top = max(self.slo.percentiles)
        return math.ceil(self.tail_requests / (1 - top / 100) - 1e-9)


@dataclass
class Replicate:
    """One complete (or budget-cut) search of every arm."""

    index: int
    """0, 1, ..."""
    brackets: dict[str, Bracket]
    """``arm -> its search`` (passes, misses, capacity, why it ended)."""
    steps: list[dict] = field(default_factory=list)
    """Every step of every arm, in the order they ran (:func:`step_record`)."""
    complete: bool = True
    """False when the time budget ended it before every arm's search was over."""


@dataclass
class CapacitySearch:
    """Every replicate, and why the search stopped."""

    config: CapacityConfig
    """The search settings."""
    stream_rate: float
    """One request stream's rate (1 / the baseline's warm-up latency): the floor is a fraction of it."""
    start_rates: dict[str, float] = field(default_factory=dict)
    """``arm -> first rate of the first replicate`` (from the probe, or ``start_rate``)."""
    probe: dict[str, dict] = field(default_factory=dict)
    """``arm -> {requests, completed, duration_s, throughput_rps}`` of the saturation probe."""
    replicates: list[Replicate] = field(default_factory=list)
    """In the order they ran."""
    stop_reason: str = ""
    """Why no further replicate ran."""


def step_record(
    runs: RunResult | Sequence[RunResult], arm: str, capacity: CapacityConfig, output_len: int
) -> dict:
    """What the JSON keeps of one arm's step (its slices' runs together): rates, arrival lag, goodput, SLO
    verdict, percentiles.

    ``slo_met`` is None (and ``counted`` False) when the client was the bottleneck. The achieved rate is the
    requests sent over the seconds each slice took from its start to its last send.
    """
    runs = [runs] if isinstance(runs, RunResult) else list(runs)
    run = runs[0]
    requests = [request for each in runs for request in each.requests]
    metrics = compute_metrics(
        requests,
        sum(each.duration_s for each in runs),
        goodput_slos_ms=capacity.slo.goodput_slos_ms,
        percentiles=capacity.percentiles(),
    )
    sent, sending_s = [], 0.0
    for each in runs:
        pairs = [
            (result.start_time, each.started + due)
            for result, due in zip(each.requests, each.offsets)
            if result.start_time > 0
        ]
        sent += pairs
        sending_s += max((send for send, _ in pairs), default=each.started) - each.started
    achieved = len(sent) / sending_s if sending_s > 0 else math.inf
    lags_ms = np.array([max(0.0, send - due) * 1000.0 for send, due in sent] or [0.0])
    client_limited = achieved < (1 - capacity.client_shortfall) * run.rate
    met = None if client_limited else capacity.slo.met(metrics)
    latency = {
        key: value
        for key, value in metrics.items()
        if key.startswith(("p", "mean_", "median_")) and key.endswith("_ms")
    }
    return {
        "arm": arm,
        "step": run.round,
        "requested_rps": run.rate,
        "achieved_rps": achieved,
        "arrival_lag_p50_ms": float(np.percentile(lags_ms, 50)),
        "arrival_lag_p99_ms": float(np.percentile(lags_ms, 99)),
        "arrival_lag_max_ms": float(lags_ms.max()),
        "client_limited": client_limited,
        "counted": met is not None,
        "slo_met": met,
        "margins": capacity.slo.margins(metrics) if metrics["completed"] else None,
        "requests": len(requests),
        "slices": len(runs),
        "completed": metrics["completed"],
        "failed": metrics["failed"],
        "errors": metrics["errors"],
        "duration_s": sum(each.duration_s for each in runs),
        "request_throughput": metrics["request_throughput"],
        "goodput_rps": metrics["request_goodput"],
        "output_throughput": metrics["output_throughput"],
        "output_len": output_len,
        **latency,
    }


def step_requests(rate: float, capacity: CapacityConfig, num_prompts: int) -> int:
    """Requests of a step at ``rate``: the most of ``rate x step_seconds``, ``min_step_requests`` and what the
    SLO's percentile needs (:meth:`CapacityConfig.percentile_requests`), at most ``num_prompts``."""
    wanted = max(
        math.ceil(rate * capacity.step_seconds), capacity.min_step_requests, capacity.percentile_requests()
    )
    return min(wanted, num_prompts)


def latency_bound_s(slo: Slo, output_len: int) -> float | None:
    """The longest a request meeting every objective can take, when the objectives bound it (else None)."""
    targets = {objective.family: objective.target_ms / 1000 for objective in slo.objectives}
    if "e2e" in targets:
        return targets["e2e"]
    per_token = targets.get("tpot", targets.get("itl"))
    if per_token is None:
        return None
    return targets.get("ttft", 0.0) + per_token * output_len


def new_bracket(search: CapacitySearch, previous: Replicate | None, arm_index: int, arm: str, seed: int):
    """The search of ``arm`` in a new replicate: from its start rate, or dithered near its last capacity."""
    capacity = search.config
    floor = search.stream_rate * capacity.floor_fraction
    if previous is None:
        start = max(floor, search.start_rates.get(arm, search.stream_rate))
        return Bracket(start, floor, capacity.factor, capacity.resolution, capacity.max_steps)
    last = previous.brackets[arm]
    center = last.capacity if last.capacity > 0 else floor
    dither = np.random.default_rng([seed, previous.index + 1, arm_index]).uniform(-0.5, 0.5)
    start = max(floor, center * (1 + capacity.resolution) ** dither)
    return Bracket(start, floor, 1 + capacity.resolution, capacity.resolution, capacity.max_steps)


async def probe_saturation(client, runner: StepRunner, search: CapacitySearch) -> None:
    """One burst of ``probe_requests`` per arm, all at once, interleaved like a step: each arm's saturation
    throughput, and its first rate (``start_fraction`` of it); fills ``search.probe`` and ``start_rates``."""
    capacity, config = search.config, runner.benchmark.config
    arms = list(runner.benchmark.targets)
    wanted = min(capacity.probe_requests, config.num_prompts)
    prompts = runner.prompts_of_step(-1, 0)
    runs = await run_round(
        client,
        runner.benchmark.targets,
        {arm: list(prompts[arm][:wanted]) for arm in arms},
        config,
        0,
        rate={arm: math.inf for arm in arms},
        model_names=runner.benchmark.model_names,
    )
    for run in runs:
        completed = sum(1 for request in run.requests if request.success)
        throughput = completed / run.duration_s if run.duration_s > 0 else 0.0
        search.probe[run.model] = {
            "requests": len(run.requests),
            "completed": completed,
            "duration_s": run.duration_s,
            "throughput_rps": throughput,
        }
        # A probe that failed outright says nothing about the rate: start at one stream's rate.
        search.start_rates[run.model] = capacity.start_fraction * throughput or search.stream_rate


class StepClock:
    """Predicts how long the next step will take, from the steps so far, so the budget is not overrun."""

    def __init__(self, arm_gap_s: float):
        self.overhead_s = 2.0 + arm_gap_s
        """Seconds one arm's slice takes beyond its arrival schedule (drain, settling, the pause), last
        measured."""

    def predict(self, schedule_s: list[float], runs: int | None = None) -> float:
        """Seconds a step of arms with these schedule lengths will take, in ``runs`` slices in all (one per
        arm when None)."""
        return sum(schedule_s) + (len(schedule_s) if runs is None else runs) * self.overhead_s

    def observe(self, schedule_s: list[float], wall_s: float, runs: int | None = None) -> None:
        """Learn from a step that took ``wall_s`` for these schedule lengths in ``runs`` slices."""
        runs = len(schedule_s) if runs is None else runs
        if runs:
            self.overhead_s = max(0.0, (wall_s - sum(schedule_s)) / runs)


def slice_plan(
    wanted: Mapping[str, int], rates: Mapping[str, float], slice_seconds: float
) -> dict[str, list[int]]:
    """``arm -> requests of each of its slices``: every arm's step cut into the same number of slices (the
    longest schedule over ``slice_seconds``, rounded up), so that slice ``j`` of every arm covers the same
    part of its step; an arm with fewer requests than slices has one request per slice and sits out the
    rest."""
    count = max(math.ceil(wanted[arm] / rate / slice_seconds - 1e-9) for arm, rate in rates.items())
    count = max(1, count)
    plan = {}
    for arm in rates:
        parts = min(count, wanted[arm])
        plan[arm] = [wanted[arm] // parts + (index < wanted[arm] % parts) for index in range(parts)]
    return plan


StepPrompts = Callable[[int, int], Mapping[str, list[Prompt]]]
"""``(replicate, step) -> arm -> prompts`` (``--num-prompts`` of them; a step takes the first it needs)."""


async def search_capacity(benchmark, prompts_of_step: StepPrompts, search: CapacitySearch, deadline: float):
    """Run replicates of the interleaved search until ``max_replicates`` or the deadline; fills ``search``.

    Args:
        benchmark: the :class:`loadtest.benchmark.Benchmark` (arms, load settings, client, model names).
        prompts_of_step: prompts of each arm at each step.
        search: the settings and first rate; its ``replicates`` and ``stop_reason`` are filled in.
        deadline: ``time.monotonic()`` by which the search must be over.
    """
    config, capacity = benchmark.config, search.config
    arms = list(benchmark.targets)
    runner = StepRunner(benchmark, prompts_of_step, capacity, deadline)
    bar = benchmark.progress("capacity replicates", capacity.max_replicates) if benchmark.progress else None
    async with make_client(config, benchmark.api_key) as client:
        if capacity.start_rate is not None:
            search.start_rates = dict.fromkeys(arms, capacity.start_rate)
        elif not search.start_rates:
            await probe_saturation(client, runner, search)
        for index in range(capacity.max_replicates):
            previous = search.replicates[-1] if search.replicates else None
            if previous is not None and not runner.has_time_for(previous):
                search.stop_reason = (
                    f"--time-budget {config.time_budget_s:g} s: no time for another replicate"
                )
                break
            brackets = {arm: new_bracket(search, previous, i, arm, config.seed) for i, arm in enumerate(arms)}
            replicate = Replicate(index, brackets)
            search.replicates.append(replicate)
            await runner.run_replicate(client, replicate)
            if bar:
                bar.update()
            if not replicate.complete:
                search.stop_reason = f"--time-budget {config.time_budget_s:g} s spent in replicate {index}"
                break
    if bar:
        bar.close()
    search.stop_reason = search.stop_reason or f"--slo-replicates {capacity.max_replicates} reached"
    return search


class StepRunner:
    """Runs the interleaved steps of a replicate within the deadline (see the module docstring)."""

    def __init__(self, benchmark, prompts_of_step: StepPrompts, capacity: CapacityConfig, deadline: float):
        self.benchmark, self.prompts_of_step, self.capacity = benchmark, prompts_of_step, capacity
        self.deadline = deadline
        self.clock = StepClock(benchmark.config.arm_gap_s)
        self.step = 0
        """Steps so far over every replicate."""
        self.turn = 0
        """Slices' turns so far over every replicate: picks the arm order and seeds the arrival times."""

    def requests(self, rate: float) -> int:
        """Requests of one arm's step at ``rate``."""
        return step_requests(rate, self.capacity, self.benchmark.config.num_prompts)

    def has_time_for(self, previous: Replicate) -> bool:
        """Whether three steps at the capacities ``previous`` found (its floor where 0) fit the deadline."""
        rates = {arm: bracket.capacity or bracket.floor for arm, bracket in previous.brackets.items()}
        wanted = {arm: self.requests(rate) for arm, rate in rates.items()}
        slices = slice_plan(wanted, rates, self.capacity.slice_seconds)
        schedule = [wanted[arm] / rate for arm, rate in rates.items()]
        predicted = self.clock.predict(schedule, sum(map(len, slices.values())))
        return time.monotonic() + 3 * predicted <= self.deadline

    async def run_replicate(self, client, replicate: Replicate) -> None:
        """Steps until every arm's search is over, or the next step would overrun the deadline."""
        while rates := {arm: rate for arm, b in replicate.brackets.items() if (rate := b.next_rate())}:
            wanted = {arm: self.requests(rate) for arm, rate in rates.items()}
            slices = slice_plan(wanted, rates, self.capacity.slice_seconds)
            schedule = [wanted[arm] / rate for arm, rate in rates.items()]
            runs = sum(map(len, slices.values()))
            if time.monotonic() + self.clock.predict(schedule, runs) > self.deadline:
                replicate.complete = False
                return
            began = time.monotonic()
            by_arm = await self.run_slices(
                client, self.prompts_of_step(replicate.index, self.step), rates, slices
            )
            self.clock.observe(schedule, time.monotonic() - began, runs)
            for arm, arm_runs in by_arm.items():
                record = step_record(arm_runs, arm, self.capacity, self.benchmark.config.output_len)
                replicate.brackets[arm].record(rates[arm], record["slo_met"])
                replicate.steps.append({"replicate": replicate.index, **record, "step": self.step})
            self.step += 1

    async def run_slices(
        self,
        client,
        prompts: Mapping[str, list[Prompt]],
        rates: dict[str, float],
        slices: dict[str, list[int]],
    ) -> dict[str, list[RunResult]]:
        """One step: slice ``j`` of every arm, turn by turn, each turn in the next row of the balanced order;
        returns ``arm -> its slices' runs`` (arms in the order they first ran)."""
        config, by_arm = self.benchmark.config, {}
        sent = dict.fromkeys(rates, 0)
        for index in range(max(map(len, slices.values()))):
            counts = {arm: parts[index] for arm, parts in slices.items() if index < len(parts)}
            turn = {arm: list(prompts[arm][sent[arm] : sent[arm] + count]) for arm, count in counts.items()}
            runs = await run_round(
                client,
                self.benchmark.targets,
                turn,
                replace(config, max_run_s=_run_limit(self.capacity, config, rates, counts)),
                self.turn,
                rate={arm: rates[arm] for arm in counts},
                model_names=self.benchmark.model_names,
            )
            self.turn += 1
            for run in runs:
                by_arm.setdefault(run.model, []).append(run)
                sent[run.model] += len(run.requests)
        return by_arm


def _run_limit(capacity: CapacityConfig, config, rates: dict[str, float], wanted: dict[str, int]) -> float:
    """Seconds one arm's slice of ``wanted`` requests may run: its schedule plus room for its last request to
    finish within the SLO several times over (a request still open then has certainly missed it)."""
    bound = latency_bound_s(capacity.slo, config.output_len)
    tail = config.max_run_s if bound is None else max(10.0, 3 * bound)
    return min(config.max_run_s, max(count / rates[arm] for arm, count in wanted.items()) + tail)
