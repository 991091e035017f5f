"""95 % intervals on one model's quality figures: accuracy over items, perplexity over windows.

* **Accuracy** (a proportion of ``n`` independent items): the exact Clopper-Pearson interval,
  ``scipy.stats.binomtest(correct, n).proportion_ci(0.95, method="exact")``. It never undercovers, holds
  the point, and stays inside [0, 1] at 0 % and 100 %, where lm-eval's ``acc_stderr`` (the normal
  approximation ``sd / sqrt(n)``) collapses to a zero-width interval.
* **Perplexity** (``exp(Σ NLL / Σ tokens)`` over windows): no exact method exists for a ratio estimator, so a
  percentile bootstrap over windows (``scipy.stats.bootstrap``, :data:`RESAMPLES` resamples, generator seeded
  with :data:`SEED`): each resample draws windows with replacement and recomputes ``exp(Σ NLL / Σ tokens)`` of
  the drawn windows — never a mean of per-window perplexities, which weights a short window like a long one
  and is biased upwards.

The seed is fixed, so a second run over the same scores gives the same interval; it is recorded with every
interval (:func:`interval_record`). Paired comparisons between two models are in
:mod:`pruning.evaluation.paired`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

CONFIDENCE = 0.95
"""The level of every interval."""
SEED = 0
"""Seed of every bootstrap (recorded with each interval)."""
RESAMPLES = 10_000
"""Bootstrap resamples per interval."""
BATCH = 500
"""Resamples per vectorised step: bounds memory at ``BATCH x n`` floats per array."""
EXACT_BINOMIAL = "Clopper-Pearson exact binomial interval over items (scipy.stats.binomtest)"
WINDOW_BOOTSTRAP = (
    "percentile bootstrap over windows of exp(sum NLL / sum tokens) (scipy.stats.bootstrap, "
    f"{RESAMPLES} resamples, seed {SEED})"
)


@dataclass(frozen=True)
class Interval:
    """A point estimate with its 95 % interval and how the interval was computed."""

    point: float
    """The estimate from every item or window."""
    low: float
    """Lower end of the 95 % interval."""
    high: float
    """Upper end of the 95 % interval."""
    n: int
    """Items or windows it rests on."""
    method: str
    """How the interval was computed, in words (stored as ``interval_method``)."""

    @property
    def ci95(self) -> list[float]:
        """``[low, high]`` as the JSON writes it."""
        return [self.low, self.high]

    def holds(self, value: float) -> bool:
        """Whether ``value`` lies in the interval (ends included)."""
        return self.low <= value <= self.high


def accuracy_interval(correct: Sequence[float]) -> Interval:
    """Accuracy of 0/1 per-item scores with its exact Clopper-Pearson 95 % interval.

    Args:
        correct: 1 for an item answered right, 0 otherwise.

    Returns:
        The accuracy and its interval over ``len(correct)`` items.
    """
    from scipy import stats

    n = len(correct)
    if n == 0:
        raise ValueError("an accuracy needs at least one item")
    right = int(round(sum(correct)))
    ci = stats.binomtest(right, n).proportion_ci(CONFIDENCE, method="exact")
    return Interval(right / n, float(ci.low), float(ci.high), n, EXACT_BINOMIAL)


def pooled_perplexity(nll: Sequence[float], tokens: Sequence[int]) -> float:
    """``exp(Σ NLL / Σ tokens)`` (capped at ``exp(700)`` instead of overflowing)."""
    return math.exp(min(sum(nll) / sum(tokens), 700.0))


def perplexity_interval(nll: Sequence[float], tokens: Sequence[int]) -> Interval:
    """Perplexity of windows with its percentile-bootstrap 95 % interval (windows resampled, ratio estimator).

    Args:
        nll: summed negative log-likelihood per window (natural log).
        tokens: tokens predicted per window.

    Returns:
        The pooled perplexity and its interval over ``len(nll)`` windows; one window gives a zero-width
        interval (nothing to resample).
    """
    import numpy as np

    n = len(nll)
    if n == 0 or n != len(tokens):
        raise ValueError("a perplexity needs as many token counts as windows, at least one")
    point = pooled_perplexity(nll, tokens)

    def statistic(window_nll, window_tokens, axis=-1):
        return np.exp(np.minimum(window_nll.sum(axis) / window_tokens.sum(axis), 700.0))

    low, high = bootstrap_percentile(
        (np.asarray(nll, dtype=float), np.asarray(tokens, dtype=float)), statistic, point
    )
    return Interval(point, low, high, n, WINDOW_BOOTSTRAP)


def bootstrap_percentile(arrays: tuple, statistic: Callable, point) -> tuple:
    """Paired percentile bootstrap of a vectorised ``statistic`` over the arrays' common first axis.

    Every array is resampled with the same indices (``paired=True``), with :data:`RESAMPLES` resamples from a
    generator seeded with :data:`SEED`. ``point`` is returned as both ends when there is a single row (nothing
    to resample) or every resample gives the same value (``scipy`` reports a degenerate distribution as NaN).

    Returns:
        ``(low, high)``: floats, or arrays when ``statistic`` returns several values.
    """
    import warnings

    import numpy as np
    from scipy import stats

    if len(arrays[0]) < 2:
        return point, point
    # a resample can divide by zero (a retention over a baseline resample with no item right): that
    # resample's value is inf or NaN, which the percentiles tolerate
    with warnings.catch_warnings(), np.errstate(divide="ignore", invalid="ignore"):
        warnings.simplefilter("ignore", stats.DegenerateDataWarning)
        result = stats.bootstrap(
            arrays,
            statistic,
            paired=True,
            vectorized=True,
            n_resamples=RESAMPLES,
            batch=BATCH,
            confidence_level=CONFIDENCE,
            method="percentile",
            rng=np.random.default_rng(SEED),
        )
    low, high = np.asarray(result.confidence_interval.low), np.asarray(result.confidence_interval.high)
    spread = np.asarray(result.bootstrap_distribution)
    flat = spread.min(axis=-1) == spread.max(axis=-1)  # every resample the same: the point itself
    low = np.where(flat | np.isnan(low), point, low)
    high = np.where(flat | np.isnan(high), point, high)
    if low.ndim == 0:
        return float(low), float(high)
    return low.astype(float), high.astype(float)


def interval_record(interval: Interval, key: str) -> dict:
    """The JSON fields of one interval: ``n``, ``KEY``, ``KEY_ci95`` and ``interval_method``."""
    record = {"n": interval.n, key: interval.point, f"{key}_ci95": interval.ci95}
    record["interval_method"] = interval.method
    if "bootstrap" in interval.method:
        record["interval_seed"] = SEED
    return record
