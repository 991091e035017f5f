"""Latency objectives (``--slo "ttft_p99_ms=500,tpot_p99_ms=50"``) and whether one run met them.

An objective bounds one percentile of one latency family, in milliseconds: ``ttft``, ``tpot``, ``itl`` or
``e2e`` (end-to-end, vLLM's ``e2el``), at any percentile (``p50``, ``p90``, ``p99``, ``p99.9``). A run meets
the SLO when every objective holds over its completed requests **and** no request failed (a failed request
has no latency that could meet anything). Per request, the same targets define goodput as ``vllm bench serve
--goodput`` does (a request counts when its TTFT, TPOT and E2E each meet their target; ITL has no
per-request value).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ground.core.errors import UserError
from loadtest.metrics import percentile_key

SLO_KEY = re.compile(r"(ttft|tpot|itl|e2e)_p([0-9]+(?:\.[0-9]+)?)_ms")
"""An objective's name: ``<family>_p<percentile>_ms``."""
FAMILY_METRIC = {"ttft": "ttft", "tpot": "tpot", "itl": "itl", "e2e": "e2el"}
"""SLO family -> the metric name of :func:`loadtest.metrics.compute_metrics` (and ``vllm bench serve``)."""
EXAMPLE = "ttft_p99_ms=500,tpot_p99_ms=50"


@dataclass(frozen=True)
class Objective:
    """One bound: a percentile of one latency family at most ``target_ms``."""

    family: str
    """``ttft``, ``tpot``, ``itl`` or ``e2e``."""
    percentile: float
    """The percentile bounded (99 = p99)."""
    target_ms: float
    """The most that percentile may be, in ms."""

    @property
    def name(self) -> str:
        """The ``--slo`` key: ``ttft_p99_ms``."""
        return f"{self.family}_p{_number(self.percentile)}_ms"

    @property
    def metric_key(self) -> str:
        """The key of the measured value in the metrics dict: ``p99_ttft_ms``."""
        return percentile_key(FAMILY_METRIC[self.family], self.percentile)

    def describe(self) -> str:
        """``p99 TTFT ≤ 500 ms``."""
        return f"p{_number(self.percentile)} {self.family.upper()} ≤ {_number(self.target_ms)} ms"


@dataclass(frozen=True)
class Slo:
    """Every objective a rate must meet."""

    objectives: tuple[Objective, ...]
    """The bounds, in the order given."""

    @property
    def percentiles(self) -> tuple[float, ...]:
        """The percentiles the objectives need measured."""
        return tuple(sorted({objective.percentile for objective in self.objectives}))

    @property
    def goodput_slos_ms(self) -> dict[str, float]:
        """Per-request targets for goodput: ``ttft``, ``tpot``, ``e2el`` (``vllm bench serve --goodput``)."""
        return {
            FAMILY_METRIC[objective.family]: objective.target_ms
            for objective in self.objectives
            if objective.family != "itl"
        }

    def margins(self, metrics: dict) -> dict[str, float]:
        """``objective name -> measured / target`` (at most 1 where the objective holds)."""
        return {
            objective.name: metrics[objective.metric_key] / objective.target_ms
            for objective in self.objectives
        }

    def met(self, metrics: dict) -> bool:
        """Whether a run with these metrics met every objective: all margins ≤ 1, nothing failed, and at
        least one request completed."""
        if metrics["failed"] or not metrics["completed"]:
            return False
        return all(margin <= 1.0 for margin in self.margins(metrics).values())

    def describe(self) -> str:
        """``p99 TTFT ≤ 500 ms, p99 TPOT ≤ 50 ms``."""
        return ", ".join(objective.describe() for objective in self.objectives)

    def as_dict(self) -> dict[str, float]:
        """``{"ttft_p99_ms": 500.0, ...}`` as the result JSON records it."""
        return {objective.name: objective.target_ms for objective in self.objectives}


def parse_slo(text: str) -> Slo:
    """``"ttft_p99_ms=500,tpot_p99_ms=50"`` -> :class:`Slo`.

    Raises:
        UserError: an empty item, an unknown key, one objective given twice (``ttft_p99.0_ms`` is
            ``ttft_p99_ms``), a missing ``=``, or a target that is not a positive finite number of ms.
    """
    from ground.core.lists import option_items

    objectives: dict[str, Objective] = {}
    for item in option_items(text, "--slo", EXAMPLE):
        key, sep, value = item.partition("=")
        key = key.strip()
        match = SLO_KEY.fullmatch(key)
        if not sep or match is None:
            raise UserError(
                f"--slo {item!r} must be KEY=MS with KEY like ttft_p99_ms, tpot_p99_ms, itl_p99_ms or "
                f"e2e_p99_ms (e.g. --slo {EXAMPLE})"
            )
        percentile = float(match.group(2))
        if not 0 < percentile < 100:
            raise UserError(f"--slo {key}: the percentile must be between 0 and 100, got {percentile:g}")
        try:
            target = float(value)
        except ValueError:
            raise UserError(f"--slo {key}: {value.strip()!r} is not a number of milliseconds") from None
        if not 0 < target < float("inf"):
            raise UserError(f"--slo {key} must be a positive number of milliseconds, got {value.strip()}")
        objective = Objective(match.group(1), percentile, target)
        if objective.name in objectives:  # ttft_p99.0_ms is ttft_p99_ms
            raise UserError(f"--slo names {objective.name} twice (as {key})")
        objectives[objective.name] = objective
    return Slo(tuple(objectives.values()))


def _number(value: float) -> str:
    """``99`` for 99.0, ``99.9`` for 99.9."""
    return f"{value:g}"
