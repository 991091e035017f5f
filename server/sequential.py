"""Confidence sequences: intervals that stay valid however often an experiment's report is read.

A fixed-horizon 95 % interval is right once, at a sample size chosen in advance. An A/B report is read every
few minutes, and stopping at the first interval that excludes "no change" makes the error rate grow with every
look (a z-test peeked at 50 times declares an A/A difference about a quarter of the time). A *confidence
sequence* holds the true value at every sample size at once with probability 95 %, so a decision taken at
any look keeps its error rate.

We use the asymptotic confidence sequence of Waudby-Smith, Arbour, Sinha, Kennedy and Ramdas ("Time-uniform
central limit theory and asymptotic confidence sequences", 2024, Theorem 2.2): for an estimate whose variance
is ``V`` (``σ²/n`` for a mean) the radius is

    sqrt( V · (V + τ²)/τ² · log((V + τ²) / (V · α²)) ),

Robbins' normal-mixture boundary with mixing variance ``τ²``. It is the same boundary as the mixture
sequential probability ratio test of Johari, Pekelis and Walsh ("Always valid inference", 2017) that
Optimizely runs, written as an interval. Estimates from several streams (an arm against its control, two
independent samples) add their variances: ``V = σ²_arm/n_arm + σ²_control/n_control``. ``τ²`` is the
asymptotic CS's ``ρ²σ²``, with ``ρ`` chosen so that the sequence is tightest near :data:`TARGET_N`
observations per arm (Waudby-Smith et al., eq. (16)); any fixed choice is valid, it only moves where the
sequence is narrowest. Ratios (latency of an arm over its control) are sequences on the difference of the
log means (the delta method), exponentiated.

The guarantee is asymptotic (variance estimated from the data), so no decision is taken before
:data:`MIN_DECISION_COUNT` observations per stream; ``tests/test_sequential.py`` simulates A/A streams looked
at 50 times and shows the false decision rate under 5 % (beside the fixed-horizon interval's).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

ALPHA = 0.05
"""One minus the coverage of every sequence (95 %)."""
TARGET_N = 200
"""Observations per arm at which the sequences are tightest (``ρ`` is tuned for it)."""
MIN_DECISION_COUNT = 30
"""No verdict before each stream has this many observations: the variance is estimated from the data, and
the asymptotic guarantee needs a few dozen of them."""
QUALITY_MARGIN = 0.05
"""Default non-inferiority margin of ``nll_delta``, in nats per generated token."""


@dataclass(frozen=True)
class Moments:
    """Sufficient statistics of one stream of per-request values: count, sum and sum of squares.

    They add across gateway replicas and time, which is what lets a report combine replicas exactly.
    """

    count: float = 0.0
    total: float = 0.0
    squares: float = 0.0

    def __add__(self, other: Moments) -> Moments:
        return Moments(self.count + other.count, self.total + other.total, self.squares + other.squares)

    def __sub__(self, other: Moments) -> Moments:
        return Moments(self.count - other.count, self.total - other.total, self.squares - other.squares)

    def add(self, value: float) -> Moments:
        return Moments(self.count + 1, self.total + value, self.squares + value * value)

    @property
    def mean(self) -> float | None:
        return self.total / self.count if self.count > 0 else None

    @property
    def variance(self) -> float | None:
        """The unbiased sample variance (None below two observations)."""
        if self.count < 2:
            return None
        mean = self.total / self.count
        return max(0.0, (self.squares - self.count * mean * mean) / (self.count - 1))


@dataclass(frozen=True)
class Sequence:
    """An estimate and its 95 % confidence sequence at this look (bounds None while undefined)."""

    estimate: float | None
    low: float | None = None
    high: float | None = None
    decidable: bool = False
    """Whether every stream has :data:`MIN_DECISION_COUNT` observations (a verdict may be given)."""

    def bounds(self) -> list[float] | None:
        return None if self.low is None or self.high is None else [self.low, self.high]


def rho_squared(alpha: float = ALPHA, target_n: float = TARGET_N) -> float:
    """Waudby-Smith et al.'s ``ρ²`` that makes the sequence tightest at ``target_n`` observations."""
    log_term = -2 * math.log(alpha)
    return (log_term + math.log(log_term + 1)) / target_n


def radius(variance_of_estimate: float, tau_squared: float, alpha: float = ALPHA) -> float:
    """Half-width of the normal-mixture confidence sequence for an estimate of this variance."""
    v = variance_of_estimate
    if v <= 0 or tau_squared <= 0:
        return 0.0
    return math.sqrt(v * (v + tau_squared) / tau_squared * math.log((v + tau_squared) / (v * alpha * alpha)))


def mean_sequence(stream: Moments, alpha: float = ALPHA) -> Sequence:
    """The mean of one stream with its confidence sequence."""
    mean, variance = stream.mean, stream.variance
    if mean is None or variance is None:
        return Sequence(mean)
    half = radius(variance / stream.count, rho_squared(alpha) * variance, alpha)
    return Sequence(mean, mean - half, mean + half, stream.count >= MIN_DECISION_COUNT)


def difference_sequence(arm: Moments, control: Moments, alpha: float = ALPHA) -> Sequence:
    """``mean(arm) − mean(control)`` of two independent streams with its confidence sequence."""
    if arm.variance is None or control.variance is None:
        estimate = None if arm.mean is None or control.mean is None else arm.mean - control.mean
        return Sequence(estimate)
    estimate = arm.mean - control.mean
    v = arm.variance / arm.count + control.variance / control.count
    half = radius(v, rho_squared(alpha) * (arm.variance + control.variance), alpha)
    decidable = min(arm.count, control.count) >= MIN_DECISION_COUNT
    return Sequence(estimate, estimate - half, estimate + half, decidable)


def ratio_sequence(arm: Moments, control: Moments, alpha: float = ALPHA) -> Sequence:
    """``mean(arm) / mean(control)`` of two independent positive streams, its sequence by the delta method
    on the log means."""
    if arm.variance is None or control.variance is None or not arm.mean or not control.mean:
        estimate = arm.mean / control.mean if arm.mean is not None and control.mean else None
        return Sequence(estimate)
    log_ratio = math.log(arm.mean / control.mean)
    # Var(log mean) ≈ CV² / n; the per-observation scale (CV²) plays σ²'s part in τ².
    cv_arm, cv_control = arm.variance / arm.mean**2, control.variance / control.mean**2
    v = cv_arm / arm.count + cv_control / control.count
    half = radius(v, rho_squared(alpha) * (cv_arm + cv_control), alpha)
    decidable = min(arm.count, control.count) >= MIN_DECISION_COUNT
    return Sequence(math.exp(log_ratio), math.exp(log_ratio - half), math.exp(log_ratio + half), decidable)


def quality_verdict(nll_delta: Sequence, margin: float = QUALITY_MARGIN) -> str:
    """``worse`` when the whole sequence lies above ``margin`` (nats per token), ``not_worse`` when it lies
    below, else ``undecided``."""
    if not nll_delta.decidable or nll_delta.low is None:
        return "undecided"
    if nll_delta.low > margin:
        return "worse"
    if nll_delta.high < margin:
        return "not_worse"
    return "undecided"


def speed_verdict(latency_ratio: Sequence) -> str:
    """``faster`` when the whole sequence of (arm over control) per-token latency lies below 1, ``slower``
    above 1, else ``undecided``."""
    if not latency_ratio.decidable or latency_ratio.low is None:
        return "undecided"
    if latency_ratio.high < 1:
        return "faster"
    if latency_ratio.low > 1:
        return "slower"
    return "undecided"
