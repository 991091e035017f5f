"""Selection among a ``prune`` run's outcomes by held-out loss, without importing torch until scoring.

:class:`HeldOutCache` builds one :class:`~pruning.pipeline.heldout.HeldOut` per calibration evaluator (the
shared evaluator of a run, or each standalone one); :func:`mark_selected` marks the outcome with the lowest
validation loss.
"""

from __future__ import annotations

import math


class HeldOutCache:
    """``cache(evaluator) -> HeldOut`` of that evaluator, built on first use."""

    def __init__(self, validation: str | None, max_ppl_ratio: float):
        self.validation = validation
        self.max_ppl_ratio = max_ppl_ratio
        self._built: tuple[object, object] | None = None

    def __call__(self, evaluator):
        from pruning.pipeline.heldout import HeldOut

        if self._built is None or self._built[0] is not evaluator:
            self._built = (evaluator, HeldOut(evaluator, self.validation, self.max_ppl_ratio))
        return self._built[1]


def mark_selected(outcomes: list) -> None:
    """Set ``selected`` on exactly one outcome, the lowest ``validation_loss`` (the first on a tie; a NaN
    loss is never the lowest), and clear it on the others."""
    if not outcomes:
        return
    losses = [
        math.inf
        if outcome.validation_loss is None or math.isnan(outcome.validation_loss)
        else outcome.validation_loss
        for outcome in outcomes
    ]
    best = losses.index(min(losses))
    for index, outcome in enumerate(outcomes):
        outcome.selected = index == best
