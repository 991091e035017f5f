"""What the subset evaluator knows of a removal set: its value (the memo), a lower bound, minibatch losses.

* **Values.** Scores are memoised by removed set (GA and BO revisit subsets); :mod:`.memo` saves them to and
  loads them from JSON, and journals them as they come, so that an interrupted search resumes without
  re-scoring.
* **Bounds.** A ranking query stops scoring a candidate once a lower bound of its loss exceeds the k-th best
  loss so far (:mod:`.shortcuts`). The book keeps such a score as a *bound*, partial losses included, apart
  from the values: never taken for a value, and completed from where it stopped when a value is asked for.
* **Minibatch losses.** EvoPress's minibatch fitness scores a set on a few samples; the per-sample losses of
  the batches it ran are kept per set (never values, which are full losses), so a set scored again on
  another minibatch runs only the batches it has not run yet.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch

from pruning.calibration.scoring.shortcuts import PartialScore
from pruning.calibration.scoring.statistics import EvaluatorStats

RemovalSet = frozenset[int]


class ScoreBook:
    """Values, lower bounds and minibatch per-sample losses of removal sets, and the counters they move.

    Args:
        num_samples: calibration samples (text windows or questions) a full loss averages over.
        loss_floor: the objective's floor of a per-sample loss; None for objectives without one.
        stats: the evaluator's work counters.
    """

    def __init__(self, num_samples: int, loss_floor: float | None, stats: EvaluatorStats):
        self.num_samples = num_samples
        self.loss_floor = loss_floor
        self.stats = stats
        self.values: dict[RemovalSet, float] = {}
        """The memo: the loss of every set scored to the end (:mod:`.memo` may swap in a journalled dict)."""
        self.bounds: dict[RemovalSet, PartialScore] = {}
        """Sets a ranking query stopped early: their partial losses, lower bounds, never values."""
        self.sample_losses: dict[RemovalSet, dict[int, float]] = {}
        """Per set, ``sample index -> loss`` of the batches minibatch scores ran."""

    def unscored(self, sets: list[RemovalSet]) -> list[RemovalSet]:
        """The distinct sets of ``sets`` without a value, in order; the others count as memo hits."""
        pending = list(dict.fromkeys(removed for removed in sets if removed not in self.values))
        self.stats.memo_hits += len(sets) - len(pending)
        return pending

    def lower_bound(self, removed: RemovalSet) -> float | None:
        """The lower bound kept for a set whose scoring a ranking query stopped early; None for any other."""
        partial = self.bounds.get(removed)
        return None if partial is None else partial.lower_bound(self.num_samples, self.loss_floor)

    def ranked(self, removed: RemovalSet) -> tuple[float, bool]:
        """``(loss, True)`` for a set with a value, else ``(lower bound, False)``."""
        if removed in self.values:
            return self.values[removed], True
        return self.lower_bound(removed), False

    def block_prior(self, num_blocks: int, influence: np.ndarray) -> np.ndarray:
        """Per block, what orders ranking queries: its single-block loss (or bound) once every block has
        one, else its Block ``influence``. Only the order depends on it."""
        singles = []
        for block in range(num_blocks):
            key = frozenset({block})
            if key in self.values:
                singles.append(self.values[key])
            elif key in self.bounds:
                singles.append(self.lower_bound(key))
            else:
                return np.asarray(influence, dtype=np.float64)
        return np.asarray(singles, dtype=np.float64)

    def open(self, group: list[RemovalSet]) -> tuple[dict[RemovalSet, PartialScore], set[RemovalSet]]:
        """Start scoring ``group``: per set its partial score (a bound's, taken out of the book, so that
        scoring resumes at its next batch), and which sets had one."""
        resumed = {removed for removed in group if removed in self.bounds}
        partials = {removed: self.bounds.pop(removed, None) or PartialScore() for removed in group}
        return partials, resumed

    def close(
        self,
        partials: dict[RemovalSet, PartialScore],
        resumed: set[RemovalSet],
        num_batches: int,
    ) -> None:
        """End scoring: a set with all ``num_batches`` scored becomes a value, any other a bound."""
        for removed, partial in partials.items():
            if partial.batches_done == num_batches:
                self.values[removed] = partial.value()
                self.stats.evaluations += 1
                self.stats.bounds_completed += removed in resumed
            else:
                self.bounds[removed] = partial
                self.stats.stopped_early += 1

    def knows(self, removed: RemovalSet, samples: Iterable[int]) -> bool:
        """Whether the minibatch losses of ``removed`` cover every one of ``samples``."""
        known = self.sample_losses.get(removed, {})
        return all(index in known for index in samples)

    def keep_sample_losses(self, removed: RemovalSet, samples: range, losses: torch.Tensor) -> None:
        """Keep the per-sample ``losses`` of one batch, whose samples are ``samples``."""
        known = self.sample_losses.setdefault(removed, {})
        known.update(zip(samples, losses.double().cpu().tolist(), strict=True))

    def sample_mean(self, removed: RemovalSet, samples: list[int]) -> float:
        """The mean of the kept per-sample losses of ``removed`` over ``samples``."""
        return float(np.mean([self.sample_losses[removed][index] for index in samples]))
