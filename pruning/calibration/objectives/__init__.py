"""Calibration objectives: one module per objective, each ``loss(batch, hidden, head, reference)``.

The registry of objectives and their facts is :data:`depthprune.core.objectives.OBJECTIVES` (ground layer,
shared with the server); the module here named like an entry computes its loss. Every loss has the same
signature::

    loss(batch, hidden, head, reference) -> per-sample losses  # a tensor [batch.num_samples]

``hidden`` is the last block's output ``[sequences, seq, hidden]`` and ``head`` maps hidden states to logits
(final norm + LM head). A loss calls ``head`` only on the positions it needs. ``reference(row)`` returns the
dense model's log-probabilities ``[seq, vocab]`` of one sequence (objectives with ``needs_reference``). The
calibration loss is the mean of the per-sample losses; lower is better.

* :mod:`.perplexity`, :mod:`.task_margin`, :mod:`.kl` — the losses;
* :mod:`.batches` — :class:`~.batches.CalibrationBatch` and how samples become batches.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from importlib import import_module

from depthprune.core.objectives import OBJECTIVES, Objective, get_objective

__all__ = ["OBJECTIVES", "Objective", "get_objective", "loss_of"]


@cache
def loss_of(objective: Objective) -> Callable:
    """The loss function of a registered objective: ``pruning.calibration.objectives.<name>.loss``.

    Raises:
        UserError: the objective is not registered.
    """
    registered = get_objective(objective.name)
    return import_module(f"{__name__}.{registered.name}").loss
