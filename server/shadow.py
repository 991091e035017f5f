"""Shadow scoring: what an arm's answers are worth to the experiment's control model, measured off the
request path.

A sampled completion (the experiment's ``shadow_rate``) is sent upstream with vLLM's ``return_token_ids``,
so the gateway learns the prompt's and the answer's token ids without re-tokenising text; the two fields
are taken out again before the client sees the answer (unless the client asked for them), so the answer is
the one it would have got. Once the answer has been sent, the ids go on a bounded queue; a few workers send
``prompt + answer`` to the control arm's engine as a token prompt with ``prompt_logprobs`` and one token to
generate, and read, for every generated position, the control's log-probability of the arm's token and
whether it was the control's top-1 (``rank == 1``):

* ``dense_nll``: mean negative log-likelihood per generated token under the control (nats);
* ``top1_agreement``: the fraction of generated tokens that are the control's greedy choice.

Nothing here can change an answer, its status or its latency: the queue is filled with ``put_nowait`` after
the response is complete, and a completion is dropped and counted (``shadow_dropped_total{reason}``) when the
queue is full, the control is down or has :attr:`GatewaySettings.shadow_max_control_in_flight` requests of
this gateway outstanding, the sequence is longer than the control's context, the experiment is gone, or the
scoring request fails.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from dataclasses import dataclass, field

import aiohttp

from server.backends import BackendPool
from server.experiments import Router
from server.metrics import GatewayMetrics, wire_value
from server.settings import GatewaySettings

log = logging.getLogger("depthprune.server")
TOKEN_FIELDS = ("prompt_token_ids", "token_ids")
"""What ``return_token_ids`` adds to vLLM's answers (at the top of a chat answer, in each choice)."""


@dataclass
class TokenCapture:
    """The token ids of one sampled request, read from vLLM's answer (body or stream events)."""

    strip: bool
    """Take the id fields out of what the client gets (the gateway asked for them, not the client)."""
    scored: bool = True
    """False when the answer came from the arm's fallback: its ids are taken out, it is not the arm's."""
    prompt_ids: list[int] | None = None
    generated_ids: list[int] = field(default_factory=list)

    def take(self, payload: dict) -> dict:
        """Read the ids of one answer or stream chunk (choice 0); return it as the client should see it.

        vLLM writes the id fields as ``null`` when they were not asked for, so taking them out is setting
        them back to ``null``: the client gets the bytes it would have got.
        """
        top = payload.get("prompt_token_ids")
        if isinstance(top, list):
            self.prompt_ids = top
        for choice in payload.get("choices") or ():
            if not isinstance(choice, dict):
                continue
            if choice.get("index", 0) == 0:
                if isinstance(choice.get("prompt_token_ids"), list):
                    self.prompt_ids = choice["prompt_token_ids"]
                if isinstance(choice.get("token_ids"), list):
                    self.generated_ids.extend(choice["token_ids"])
            if self.strip:
                for name in TOKEN_FIELDS:
                    if name in choice:
                        choice[name] = None
        if self.strip and "prompt_token_ids" in payload:
            payload["prompt_token_ids"] = None
        return payload

    @staticmethod
    def only_ids(payload: dict) -> bool:
        """A chat chunk that vLLM sends only because token ids were asked for (nothing in its delta, no
        finish, no logprobs, no usage): without them it would not have been sent at all."""
        choices = payload.get("choices")
        if payload.get("object") != "chat.completion.chunk" or not choices or payload.get("usage"):
            return False
        return all(
            isinstance(choice, dict)
            and not choice.get("delta")
            and choice.get("finish_reason") is None
            and choice.get("logprobs") is None
            for choice in choices
        )

    def take_body(self, body: bytes) -> bytes:
        """A non-streamed answer, its ids read (and removed when the gateway added them)."""
        try:
            payload = json.loads(body)
        except ValueError:
            return body
        if not isinstance(payload, dict):
            return body
        payload = self.take(payload)
        return _dumps(payload) if self.strip else body

    def take_events(self, events: bytes) -> bytes:
        """Complete server-sent events of a stream, their ids read (removed when the gateway added them)."""
        kept = []
        for event in events.split(b"\n\n"):
            if not event:
                continue
            if event.startswith(b"data: {"):
                try:
                    payload = json.loads(event[6:])
                except ValueError:
                    payload = None
                if isinstance(payload, dict):
                    payload = self.take(payload)
                    if self.strip:
                        if self.only_ids(payload):
                            continue
                        event = b"data: " + _dumps(payload)
            kept.append(event + b"\n\n")
        return b"".join(kept)


def _dumps(payload: dict) -> bytes:
    # vLLM writes compact JSON with the characters as they are (pydantic's model_dump_json).
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()


@dataclass(frozen=True)
class ShadowJob:
    """One completed completion of an arm, waiting to be scored by the experiment's control."""

    experiment: str
    arm: str
    control_variant: str
    prompt_ids: list[int]
    generated_ids: list[int]


def score_prompt_logprobs(prompt_logprobs: list, start: int, generated_ids: list[int]) -> tuple[float, float]:
    """``(dense_nll, top1_agreement)`` of the generated tokens from vLLM's ``prompt_logprobs``.

    Args:
        prompt_logprobs: one entry per position of ``prompt + generated`` (None for the first), each
            ``{token_id: {"logprob", "rank", ...}}`` holding at least the token at that position.
        start: the position of the first generated token.
        generated_ids: the arm's tokens.

    Raises:
        ValueError: an entry lacks the token at its position (the answer is not what was asked).
    """
    nll, top1 = 0.0, 0
    for offset, token in enumerate(generated_ids):
        entry = prompt_logprobs[start + offset] or {}
        found = entry.get(str(token), entry.get(token))
        if not isinstance(found, dict) or not isinstance(found.get("logprob"), int | float):
            raise ValueError(f"no log-probability for token {token} at position {start + offset}")
        logprob = float(found["logprob"])
        nll -= logprob if math.isfinite(logprob) else -1e4  # -inf: a token the control never makes
        top1 += found.get("rank") == 1
    return nll / len(generated_ids), top1 / len(generated_ids)


class ShadowScorer:
    """The bounded queue and the workers that score sampled completions with the control's engine."""

    def __init__(self, settings: GatewaySettings, pool: BackendPool, router: Router, metrics: GatewayMetrics):
        self.settings, self.pool, self.router, self.metrics = settings, pool, router, metrics
        self.queue: asyncio.Queue[ShadowJob] = asyncio.Queue(maxsize=settings.shadow_queue_size)
        self._workers: list[asyncio.Task] = []

    def start(self) -> None:
        self._workers = [asyncio.create_task(self._work()) for _ in range(self.settings.shadow_workers)]

    async def stop(self) -> None:
        for worker in self._workers:
            worker.cancel()
        if self._workers:
            await asyncio.wait(self._workers, timeout=2)
        self._workers = []

    def submit(self, job: ShadowJob) -> None:
        """Queue ``job`` without waiting; a full queue drops it (counted)."""
        if not job.generated_ids or not job.prompt_ids:
            self._dropped(job, "failed")
            return
        try:
            self.queue.put_nowait(job)
        except asyncio.QueueFull:
            self._dropped(job, "queue_full")

    def _dropped(self, job: ShadowJob, reason: str) -> None:
        live = self._live(job)
        labels = (wire_value(job.experiment), wire_value(job.arm)) if live else ("", "")
        self.metrics.shadow_dropped.labels(*labels, reason if live else "experiment_gone").inc()

    def _live(self, job: ShadowJob) -> bool:
        """Whether the job's experiment still routes its arm here (else its series must not come back)."""
        experiment = self.router.experiments.get(job.experiment)
        return experiment is not None and job.arm in experiment.by_name

    async def _work(self) -> None:
        while True:
            job = await self.queue.get()
            try:
                await self._score(job)
            except asyncio.CancelledError:
                raise
            except Exception as error:  # a scoring failure is counted, never raised into the gateway
                log.info("shadow scoring of %s/%s failed: %r", job.experiment, job.arm, error)
                self._dropped(job, "failed")
            finally:
                self.queue.task_done()

    async def _score(self, job: ShadowJob) -> None:
        if not self._live(job):
            self._dropped(job, "experiment_gone")
            return
        control = self.pool.variants.get(job.control_variant)
        replica = control.choose_replica() if control is not None and control.up else None
        if replica is None:
            self._dropped(job, "control_down")
            return
        if replica.outstanding >= self.settings.shadow_max_control_in_flight:
            self._dropped(job, "control_busy")
            return
        sequence = [*job.prompt_ids, *job.generated_ids]
        if control.max_model_len is not None and len(sequence) + 1 > control.max_model_len:
            self._dropped(job, "too_long")
            return
        request = {
            "model": replica.served_model,
            "prompt": sequence,
            "max_tokens": 1,
            "temperature": 0,
            "prompt_logprobs": 1,
        }
        replica.outstanding += 1
        try:
            timeout = aiohttp.ClientTimeout(total=self.settings.shadow_timeout_s)
            async with self.pool.session.post(
                f"{replica.url}/v1/completions", json=request, timeout=timeout
            ) as response:
                if response.status != 200:
                    raise RuntimeError(f"control answered {response.status}: {(await response.text())[:200]}")
                answer = await response.json()
        finally:
            replica.outstanding -= 1
        logprobs = answer["choices"][0]["prompt_logprobs"]
        dense_nll, agreement = score_prompt_logprobs(logprobs, len(job.prompt_ids), job.generated_ids)
        if self._live(job):  # the experiment may have gone while the control was scoring
            self.metrics.observe_shadow(job.experiment, job.arm, dense_nll, agreement)
        else:
            self._dropped(job, "experiment_gone")
