"""95 % intervals on ratios measured in interleaved rounds, and the verdicts a report draws from them.

Each round measures every arm back to back under the same load, so a round gives one ratio per metric
(variant / baseline). The ratios are combined on the log scale: the point estimate is the geometric mean of
the per-round ratios and the interval is **Student's t-interval on the per-round log-ratios**
(``scipy.stats.t``), mapped back with ``exp``::

    x_i = log(ratio_i);  m = mean(x);  s = sd(x, ddof=1);  h = t_{0.975, n-1} * s / sqrt(n)
    point = exp(m);  ci95 = [exp(m - h), exp(m + h)];  precision = exp(h) - 1

The t-interval rather than a bootstrap because the rounds are few (3 to 40): a percentile bootstrap of so
few values is too narrow (it cannot reach beyond the observed extremes), while log-ratios of paired,
interleaved runs are close to normal and the t-interval is exact for them. ``precision`` is the relative
half-width of the interval (0.03 = the interval is point x [1/1.03, 1.03]), what ``--target-precision`` asks
for. One round gives a point and no interval.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

CONFIDENCE = 0.95
"""The level of every interval."""


@dataclass(frozen=True)
class RatioEstimate:
    """A ratio measured over rounds: geometric-mean point, 95 % interval and its relative half-width."""

    point: float | None
    """Geometric mean of the per-round ratios; None without any usable round."""
    low: float | None
    """Lower end of the 95 % interval; None with fewer than two rounds."""
    high: float | None
    """Upper end of the 95 % interval; None with fewer than two rounds."""
    rounds: int
    """Rounds that gave a usable (positive, finite) ratio."""

    @property
    def ci95(self) -> list[float] | None:
        """``[low, high]`` as the result JSON writes it, or None."""
        return None if self.low is None else [self.low, self.high]

    @property
    def precision(self) -> float | None:
        """Relative half-width ``sqrt(high / low) - 1`` (= exp(h) - 1); None without an interval."""
        if self.low is None:
            return None
        return math.sqrt(self.high / self.low) - 1.0

    def holds(self, value: float) -> bool:
        """Whether the interval contains ``value`` (False without an interval)."""
        return self.low is not None and self.low <= value <= self.high

    def scaled(self, factor: float) -> RatioEstimate:
        """The same estimate divided by ``factor`` (a ratio to the ideal speedup, say)."""

        def divide(value: float | None) -> float | None:
            return None if value is None else value / factor

        return RatioEstimate(divide(self.point), divide(self.low), divide(self.high), self.rounds)


def estimate_ratio(ratios: Sequence[float | None]) -> RatioEstimate:
    """The :class:`RatioEstimate` of per-round ratios (non-positive, non-finite and None are skipped)."""
    from scipy import stats

    logs = [math.log(value) for value in ratios if value is not None and value > 0 and math.isfinite(value)]
    count = len(logs)
    if count == 0:
        return RatioEstimate(None, None, None, 0)
    mean = sum(logs) / count
    if count == 1:
        return RatioEstimate(math.exp(mean), None, None, 1)
    sd = math.sqrt(sum((value - mean) ** 2 for value in logs) / (count - 1))
    half_width = float(stats.t.ppf(0.5 + CONFIDENCE / 2, count - 1)) * sd / math.sqrt(count)
    return RatioEstimate(math.exp(mean), math.exp(mean - half_width), math.exp(mean + half_width), count)


def speedup_verdict(speedup: RatioEstimate, fraction_of_ideal: RatioEstimate | None) -> str | None:
    """Why a speed-up must not be read as a result, or None when it can be.

    Returns:
        ``"measurement problem: ..."`` when the fraction of the ideal speedup is above 1 with an interval that
        does not reach below 1 (removing M of N blocks cannot speed serving up by more than N/(N-M)), else
        ``"no measurable change"`` when the speed-up's interval holds 1.0, else None.
    """
    if fraction_of_ideal is not None and fraction_of_ideal.low is not None and fraction_of_ideal.low > 1.0:
        return (
            f"measurement problem: {fraction_of_ideal.point:.2f} [{fraction_of_ideal.low:.2f}, "
            f"{fraction_of_ideal.high:.2f}] of the ideal speedup is physically impossible"
        )
    if speedup.holds(1.0):
        return "no measurable change"
    return None


def format_ratio(estimate: RatioEstimate, suffix: str = "", digits: int = 2) -> str:
    """``1.27x [1.21, 1.33]`` (``suffix="x"``), ``0.83 [0.74, 0.92]``, or the point alone without interval."""
    if estimate.point is None:
        return "–"
    text = f"{estimate.point:.{digits}f}{suffix}"
    if estimate.low is not None:
        text += f" [{estimate.low:.{digits}f}, {estimate.high:.{digits}f}]"
    return text


def speedup_text(
    point: float | None, ci95: Sequence[float] | None, verdict: str | None, suffix: str = "x"
) -> str:
    """A speed-up as tables print it: ``1.27x [1.21, 1.33]``, ``no measurable change (1.02x [0.97, 1.07])``
    when its interval holds 1, and ``measurement problem`` (never the number) when flagged."""
    text = format_ratio(from_json(point, ci95), suffix)
    if verdict and verdict.startswith("measurement problem"):
        return "measurement problem"
    if verdict == "no measurable change":
        return f"no measurable change ({text})"
    return text


def from_json(point: float | None, ci95: Sequence[float] | None, rounds: int = 0) -> RatioEstimate:
    """A :class:`RatioEstimate` back from the result JSON's ``value`` and ``value_ci95``."""
    if ci95 is None:
        return RatioEstimate(point, None, None, rounds)
    return RatioEstimate(point, ci95[0], ci95[1], rounds)
