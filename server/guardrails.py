"""Guardrails that act: an arm whose confidence sequence lies wholly beyond a limit is stopped.

An experiment's ``guardrails`` (``max_nll_delta``, ``max_tpot_ratio``) are checked every
``guardrail_interval_s`` against this gateway's own statistics of each arm (:meth:`GatewayMetrics.moments`).
When the 95 % confidence sequence of an arm's ``nll_delta`` lies wholly above ``max_nll_delta`` (or its
``tpot_ratio`` wholly above ``max_tpot_ratio``), the gateway sets the arm's weight to 0 through the same
versioned compare-and-set as an operator (:meth:`SharedExperiments.put` with ``If-Match`` on the version it
routes by), as a new version signed ``guardrail`` whose ``reason`` gives the figures. The arm's users move to
the other arms by the sticky rule (the cumulative split skips a zero weight).

Exactly once across replicas: every replica that sees the limit passed writes against the version it routes
by; the first write wins, the others find the version moved (``StaleVersion``) and, once they have read the
new version, see the arm at weight 0 and do nothing.

An operator re-enables the arm with an ordinary change. From then on the arm is judged on what it does after
being re-enabled (its statistics at that moment are the baseline), so the guardrail does not undo the
operator's change on old evidence; if the arm still passes the limit on new traffic, it is stopped again.
The sequences are valid at every look, so checking every second costs no false stops beyond their 5 %.
"""

from __future__ import annotations

import asyncio
import logging

from server.experiment_sync import SharedExperiments, StoreUnavailable
from server.experiments import Experiment
from server.metrics import GatewayMetrics, wire_value
from server.sequential import Moments, Sequence, difference_sequence, ratio_sequence

log = logging.getLogger("depthprune.server")
ACTOR = "guardrail"


def _fmt(sequence: Sequence) -> str:
    return f"{sequence.estimate:.4g} [{sequence.low:.4g}, {sequence.high:.4g}]"


LIMITS = (
    # spec field, compared measure, its sequence, what the figures are in, what the counts are of
    ("max_nll_delta", "dense_nll", "nll_delta", difference_sequence, "nats per token", "completions scored"),
    ("max_tpot_ratio", "tpot", "tpot_ratio", ratio_sequence, "", "requests"),
)
"""Each guardrail: the limit, the per-request measure it compares, and how (a difference or a ratio)."""


def breach(arm: dict[str, Moments], control: dict[str, Moments], limits) -> str | None:
    """Why ``arm`` passes a limit (its figures), or None while every sequence still reaches within it."""
    empty = Moments()
    for field, measure, name, sequence_of, unit, counted in LIMITS:
        limit = getattr(limits, field)
        if limit is None:
            continue
        sequence = sequence_of(arm.get(measure, empty), control.get(measure, empty))
        if sequence.decidable and sequence.low > limit:
            shown = f"{name} {_fmt(sequence)}" + (f" {unit}" if unit else "")
            return (
                f"{shown} (95 % confidence sequence) lies above {field} {limit:g}; "
                f"{arm[measure].count:.0f} {counted} against the control's {control[measure].count:.0f}"
            )
    return None


class Guardrails:
    """Checks every experiment's guardrails on a timer and stops the arms that pass them."""

    def __init__(self, shared: SharedExperiments, metrics: GatewayMetrics, interval_s: float):
        self.shared, self.metrics, self.interval_s = shared, metrics, interval_s
        self._weights: dict[tuple[str, str], float] = {}
        """The weight each arm had at the last check: an arm seen going from 0 to positive is re-enabled."""
        self._baselines: dict[tuple[str, str], dict[str, Moments]] = {}
        """Each re-enabled arm's statistics when it was re-enabled: it is judged on what came after."""
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait({self._task}, timeout=2)
            self._task = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.check()
            except Exception:  # a bug must not end the guardrails for the life of the gateway
                log.exception("checking the guardrails failed")

    async def check(self) -> None:
        """One pass over every experiment with guardrails."""
        for name, experiment in list(self.shared.router.experiments.items()):
            if experiment.spec.guardrails is None:
                continue
            moments = self.metrics.moments(name)
            for arm in experiment.arms:
                reason = self._judge(name, experiment, arm.name, arm.weight, moments)
                if reason is not None:
                    await self._stop_arm(name, experiment, arm.name, reason)

    def _judge(self, name: str, experiment: Experiment, arm: str, weight: float, moments: dict) -> str | None:
        key = (name, arm)
        current = moments.get(wire_value(arm), {})
        if self._weights.get(key) == 0 and weight > 0:
            self._baselines[key] = dict(current)  # re-enabled: judged on new traffic only
        self._weights[key] = weight
        if arm == experiment.control or weight <= 0:
            return None
        baseline = self._baselines.get(key, {})
        since = {measure: value - baseline.get(measure, Moments()) for measure, value in current.items()}
        control = moments.get(wire_value(experiment.control), {})
        return breach(since, control, experiment.spec.guardrails)

    async def _stop_arm(self, name: str, experiment: Experiment, arm: str, reason: str) -> None:
        from registry.experiments import StaleVersion

        version = self.shared.version(name)
        if version is None or self.shared.router.experiments.get(name) is not experiment:
            return  # changed since this check began: judged again at the next one
        spec = experiment.spec.model_copy(deep=True)
        for arm_spec in spec.arms:
            if arm_spec.name == arm:
                arm_spec.weight = 0.0
        if sum(arm_spec.weight for arm_spec in spec.arms) <= 0:
            log.warning(
                "guardrail: %s/%s passes its limit but is the last arm with traffic: %s", name, arm, reason
            )
            return
        reason = f"arm {arm!r} stopped: {reason}"
        try:
            _, new_version = await self.shared.put(
                name, spec, actor=ACTOR, expected_version=version, reason=reason
            )
        except StaleVersion:
            return  # another replica (or an operator) changed it first: judged again on the new version
        except StoreUnavailable as error:
            log.warning("guardrail: could not stop %s/%s (%s); trying again", name, arm, error)
            return
        log.warning("guardrail: experiment %r version %d: %s", name, new_version, reason)
