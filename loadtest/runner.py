"""Put load on a server: one model's timed run, warm-ups, and interleaved rounds over several models.

Every loop here is bounded: a run sends exactly ``num_prompts`` requests, each request has a time limit,
and a whole run has one too (requests still open when it expires are cancelled and counted as failed).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import aiohttp

from loadtest.arrivals import arrival_offsets
from loadtest.client import CONNECT_TIMEOUT_S, RequestResult, stream_completion
from loadtest.config import LoadConfig
from loadtest.metrics import compute_metrics
from loadtest.order import round_order
from loadtest.prompts import Prompt


@dataclass
class RunResult:
    """One model's measured run in one round."""

    model: str
    """The model name sent in requests."""
    round: int
    """Round index (0-based)."""
    rate: float
    """Request rate of the run (``inf`` = all at once)."""
    duration_s: float
    """Wall seconds from the start of sending to the last completion."""
    requests: list[RequestResult] = field(default_factory=list)
    """Per-request measurements, in sending order."""
    started: float = 0.0
    """``time.perf_counter()`` when the schedule began (request ``i`` was due at ``started + offsets[i]``)."""
    offsets: list[float] = field(default_factory=list)
    """The arrival schedule: seconds after ``started`` at which each request was due."""

    def metrics(self, config: LoadConfig) -> dict:
        """The ``vllm bench serve`` summary of this run."""
        return compute_metrics(
            self.requests,
            self.duration_s,
            goodput_slos_ms=config.goodput_slos_ms,
            percentiles=config.percentiles,
        )


def make_client(config: LoadConfig, api_key: str | None = None) -> aiohttp.ClientSession:
    """An ``aiohttp.ClientSession`` whose connection pool fits the load; make it inside the event loop.

    Requests give it ``allow_redirects=False`` (see ``stream_completion``), so only the URL the user
    gave is contacted; environment proxies are not used either (aiohttp's ``trust_env`` stays off).
    """
    connections = max(16, min(config.max_concurrency or config.num_prompts, 4096))
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    return aiohttp.ClientSession(
        headers=headers,
        connector=aiohttp.TCPConnector(limit=connections),
        timeout=aiohttp.ClientTimeout(total=config.request_timeout_s, sock_connect=CONNECT_TIMEOUT_S),
    )


async def timed_run(
    client: aiohttp.ClientSession,
    target: str,
    model: str,
    prompts: Sequence[Prompt],
    config: LoadConfig,
    *,
    rate: float | None = None,
    round_index: int = 0,
    on_request_done: Callable[[], None] | None = None,
) -> RunResult:
    """Send ``prompts`` to ``model`` on the arrival schedule of ``config`` and time every token.

    Args:
        client: Shared HTTP session (:func:`make_client`).
        target: Base URL of the server.
        model: Model name for the requests.
        prompts: One prompt per request, in sending order.
        config: Load settings (burstiness, concurrency cap, output length, time limits, seed).
        rate: Request rate overriding ``config.rate`` (the sweep uses it).
        round_index: Recorded in the result; also varies nothing else, so all models see one schedule.
        on_request_done: Called after each request (progress bars).

    Returns:
        The :class:`RunResult` with one :class:`RequestResult` per prompt.
    """
    rate = config.rate if rate is None else rate
    offsets = arrival_offsets(len(prompts), rate, config.burstiness, seed=config.seed + round_index)
    semaphore = (
        asyncio.Semaphore(config.max_concurrency) if config.max_concurrency else contextlib.nullcontext()
    )
    results: list[RequestResult | None] = [None] * len(prompts)
    start = time.perf_counter()

    async def one(index: int) -> None:
        delay = start + offsets[index] - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        arrival = time.perf_counter()
        async with semaphore:
            result = await stream_completion(
                client,
                target,
                model,
                prompts[index].text,
                config.output_len,
                prompt_len_estimate=prompts[index].estimated_len,
                ignore_eos=config.ignore_eos,
                timeout_s=config.request_timeout_s,
            )
        result.queue_time = result.start_time - arrival
        results[index] = result
        if on_request_done:
            on_request_done()

    tasks = [asyncio.create_task(one(i)) for i in range(len(prompts))]
    _, pending = await asyncio.wait(tasks, timeout=config.max_run_s)
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.gather(*pending, return_exceptions=True)
    duration = time.perf_counter() - start
    for task in tasks:
        if not task.cancelled() and task.exception() is not None:
            raise task.exception()
    cut = f"still open after the run limit of {config.max_run_s:g} s"
    filled = [result or RequestResult(error_kind="run_time_limit", error=cut) for result in results]
    return RunResult(model, round_index, rate, duration, filled, started=start, offsets=offsets)


async def warm_up(
    client: aiohttp.ClientSession, target: str, model: str, prompts: Sequence[Prompt], config: LoadConfig
) -> list[RequestResult]:
    """Send ``prompts`` (unmeasured) to ``model``, at most ``max_concurrency`` at a time."""
    semaphore = (
        asyncio.Semaphore(config.max_concurrency) if config.max_concurrency else contextlib.nullcontext()
    )

    async def one(prompt: Prompt) -> RequestResult:
        async with semaphore:
            return await stream_completion(
                client,
                target,
                model,
                prompt.text,
                config.output_len,
                prompt_len_estimate=prompt.estimated_len,
                ignore_eos=config.ignore_eos,
                timeout_s=config.request_timeout_s,
            )

    return list(await asyncio.gather(*(one(prompt) for prompt in prompts)))


SETTLE_OUTPUT_LEN = 4
"""Tokens each settling request generates: enough to run a prefill and a few decode steps."""


async def settle(
    client: aiohttp.ClientSession, target: str, model: str, prompts: Sequence[Prompt], config: LoadConfig
) -> None:
    """Short unmeasured requests to ``model`` right before its timed run (``config.settle_requests``).

    They keep the start of an arm's idle engine (first batch after the other arms ran) out of its timed run.
    Measured here (docs/benchmarks.md): a run whose previous run went to another vLLM CPU engine stalled about
    1 s before its first token in 32 of 59 runs, never after the same engine (0 of 30); two settling
    requests did not remove that stall (27 of 59 with them), so it is not a cold first batch; the pause before
    them (``config.arm_gap_s``, 2 s) did (0 of 59): it was the previous engine's leftover work. Their prompts
    start with ``settle`` so the measured prompts are not in the prefix cache because of them.
    """
    short = replace(config, output_len=SETTLE_OUTPUT_LEN)
    tagged = [
        Prompt(text="settle " + prompt.text, estimated_len=prompt.estimated_len + 1) for prompt in prompts
    ]
    await warm_up(client, target, model, tagged, short)


RoundPrompts = Sequence[Prompt] | Mapping[str, Sequence[Prompt]]
"""A round's prompts: one list for every arm, or ``arm -> its own list`` (distinct prompts per arm)."""


async def pause_between_arms(seconds: float) -> None:
    """The quiet ``--arm-gap`` seconds before an arm of another model (its own name, so a test replaces this
    pause alone, not every ``asyncio.sleep`` of the process)."""
    await asyncio.sleep(seconds)


async def run_round(
    client: aiohttp.ClientSession,
    targets: dict[str, str],
    prompts: RoundPrompts,
    config: LoadConfig,
    round_index: int,
    *,
    rate: float | Mapping[str, float] | None = None,
    model_names: Mapping[str, str] | None = None,
    on_request_done: Callable[[], None] | None = None,
) -> list[RunResult]:
    """Run every arm once, in the balanced order of ``round_index`` (:mod:`loadtest.order`), under its load.

    Args:
        client: Shared HTTP session (:func:`make_client`).
        targets: ``arm -> base URL``, in the order given by the user.
        prompts: The round's prompts (see :data:`RoundPrompts`).
        config: Load settings.
        round_index: Which round (picks the order, seeds the arrival times).
        rate: Request rate overriding ``config.rate``, or ``arm -> its rate``: then an arm not listed sits
            this round out (the capacity search, :mod:`loadtest.capacity`, whose arms finish apart).
        model_names: ``arm -> model name sent in requests``; an arm not listed sends its own name (the A/A
            arm sends the baseline's).
        on_request_done: Called after each request.

    Returns:
        The arms' runs, in the order they ran (``RunResult.model`` is the arm).
    """
    runs, previous_model = [], None
    for arm in round_order(list(targets), round_index):
        if isinstance(rate, Mapping) and arm not in rate:
            continue
        arm_rate = rate[arm] if isinstance(rate, Mapping) else rate
        arm_prompts = prompts[arm] if isinstance(prompts, Mapping) else prompts
        model = (model_names or {}).get(arm, arm)
        if config.arm_gap_s and model != previous_model:  # the A/A arm right after dense: same engine
            await pause_between_arms(config.arm_gap_s)
        previous_model = model
        if config.settle_requests:
            await settle(client, targets[arm], model, arm_prompts[: config.settle_requests], config)
        run = await timed_run(
            client,
            targets[arm],
            model,
            arm_prompts,
            config,
            rate=arm_rate,
            round_index=round_index,
            on_request_done=on_request_done,
        )
        run.model = arm
        runs.append(run)
    return runs


async def interleaved_rounds(
    client: aiohttp.ClientSession,
    targets: dict[str, str],
    prompts_per_round: Sequence[RoundPrompts],
    config: LoadConfig,
    *,
    rate: float | None = None,
    model_names: Mapping[str, str] | None = None,
    on_request_done: Callable[[], None] | None = None,
    on_run_done: Callable[[RunResult], None] | None = None,
) -> list[RunResult]:
    """Run every arm once per round under the identical load of that round (:func:`run_round`).

    Returns:
        All runs, in the order they ran.
    """
    runs: list[RunResult] = []
    for round_index, prompts in enumerate(prompts_per_round):
        for run in await run_round(
            client,
            targets,
            prompts,
            config,
            round_index,
            rate=rate,
            model_names=model_names,
            on_request_done=on_request_done,
        ):
            runs.append(run)
            if on_run_done:
                on_run_done(run)
    return runs
