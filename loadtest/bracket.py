"""The rate search of one arm in one replicate: bracket the highest rate that meets the SLO, then bisect.

A pure state machine (no I/O), so its decisions are tested without a server. :meth:`Bracket.next_rate`
says which rate to try next; :meth:`Bracket.record` takes that rate's outcome: ``True`` (every objective
held), ``False`` (one missed, or a request failed), or ``None`` (the client fell behind its own schedule:
the step says nothing about the server and does not count).

1. **Expand**: from ``start``, multiply by ``factor`` while the SLO holds; divide by it while it does not.
   A miss at ``floor`` (the lowest rate worth trying: about a quarter of what one request stream sends, where
   requests barely overlap and latency is the unloaded one) ends the search with capacity 0.
2. **Bisect** on the log scale (the geometric mean of the bracket) until the highest passing rate ``low``
   and the lowest failing rate above it ``high`` are within ``1 + resolution`` of each other.

The capacity is ``low``, the highest rate observed to meet the SLO (what ``vllm bench sweep serve_sla``
reports too); the true threshold lies in ``[low, high)``. A pass above a failure (noise near the threshold)
does not raise ``low``: ``low`` is the highest pass *below* the lowest failure. A client-bound step caps the
search at that rate: rates at or above it cannot be measured, so the capacity is then a lower bound
(``censored``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class Bracket:
    """Where one arm's rate search stands."""

    start: float
    """First rate tried, req/s."""
    floor: float
    """Lowest rate tried: a miss here means capacity 0 at this SLO."""
    factor: float = 2.0
    """Expansion step (each step multiplies or divides the rate by it)."""
    resolution: float = 0.1
    """The search ends once ``high / low <= 1 + resolution``."""
    max_steps: int = 12
    """Most rates tried (a safety bound; the search normally ends well before)."""
    passed: list[float] = field(default_factory=list)
    """Rates that met the SLO."""
    failed: list[float] = field(default_factory=list)
    """Rates that missed it."""
    ceiling: float = math.inf
    """Lowest rate at which the client fell behind (rates at or above it cannot be measured)."""
    steps: int = 0
    """Rates tried, counted or not."""

    def __post_init__(self):
        if not (0 < self.floor <= self.start < math.inf):
            raise ValueError(f"need 0 < floor <= start < inf, got floor {self.floor}, start {self.start}")
        if self.factor <= 1 or self.resolution <= 0:
            raise ValueError("the factor must be above 1 and the resolution positive")

    @property
    def high(self) -> float | None:
        """The lowest rate that missed the SLO, or None before any miss."""
        return min(self.failed, default=None)

    @property
    def low(self) -> float | None:
        """The highest rate that met the SLO below :attr:`high`, or None before any such pass."""
        high = self.high if self.high is not None else math.inf
        return max((rate for rate in self.passed if rate < high), default=None)

    @property
    def capacity(self) -> float:
        """The highest rate that met the SLO (0 when none did)."""
        return self.low or 0.0

    @property
    def censored(self) -> bool:
        """Whether the capacity is only a lower bound (no miss above it: the client or the step limit
        stopped the search first)."""
        return self.low is not None and self.high is None

    def record(self, rate: float, met: bool | None) -> None:
        """The outcome of trying ``rate``: met, missed, or None when the client was the bottleneck."""
        self.steps += 1
        if met is None:
            self.ceiling = min(self.ceiling, rate)
        elif met:
            self.passed.append(rate)
        else:
            self.failed.append(rate)

    def next_rate(self) -> float | None:
        """The next rate to try, or None when the search is over (see :meth:`stop_reason`)."""
        return self._next()[0]

    def stop_reason(self) -> str | None:
        """Why the search is over, or None while it goes on."""
        return self._next()[1]

    def _next(self) -> tuple[float | None, str | None]:
        if self.steps >= self.max_steps:
            return None, f"{self.max_steps} steps tried"
        if not self.passed and not self.failed:
            if self.start >= self.ceiling:
                return None, f"the client could not send {self.start:.3g} req/s"
            return self.start, None
        low, high = self.low, self.high
        if low is None:  # only misses so far: go down, unless the floor missed already
            rate = min(self.failed) / self.factor
            if min(self.failed) <= self.floor * (1 + 1e-9):
                return None, f"missed the SLO at {min(self.failed):.3g} req/s, the lowest rate tried"
            return max(rate, self.floor), None
        top = min(high if high is not None else math.inf, self.ceiling)
        if top / low <= (1 + self.resolution) * (1 + 1e-9):  # x1.1 in floats can exceed 1.1
            if high is None or self.ceiling < high:
                return None, f"client-bound: could not send {self.ceiling:.3g} req/s"
            return None, f"bracketed within {self.resolution:.0%}"
        if top == math.inf:
            return low * self.factor, None
        return math.sqrt(low * top), None
