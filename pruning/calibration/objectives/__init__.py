"""Calibration objectives: one module per objective, each ``loss(batch, hidden, head, reference)``.

The registry of objectives and their facts is :data:`ground.core.objectives.OBJECTIVES` (ground layer,
shared with the server); the module here named like an entry computes its loss, and :data:`LOSSES` follows
from that table (imported on first use, checked against :class:`Loss`). Every loss has the same
signature::

    loss(batch, hidden, head, reference) -> per-sample losses  # a tensor [batch.num_samples]

``hidden`` is the last block's output ``[sequences, seq, hidden]`` and ``head`` maps hidden states to logits
(final norm + LM head). A loss calls ``head`` only on the positions it needs. ``reference(row)`` returns the
dense model's log-probabilities ``[seq, vocab]`` of one sequence (objectives with ``needs_reference``). The
calibration loss is the mean of the per-sample losses; lower is better.

* :mod:`.perplexity`, :mod:`.task_margin`, :mod:`.task_ce`, :mod:`.kl` — the losses;
* :func:`configured_loss` — a calibration configuration's loss (parameters, ``--kl-weight``);
* :mod:`.batches` — :class:`~.batches.CalibrationBatch` and how samples become batches.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from ground.core.objectives import OBJECTIVES, Objective, get_objective
from ground.core.registry_table import NamedTable

if TYPE_CHECKING:
    import torch

    from pruning.calibration.config import CalibrationConfig
    from pruning.calibration.objectives.batches import CalibrationBatch, Head, Reference

__all__ = ["LOSSES", "Loss", "OBJECTIVES", "Objective", "configured_loss", "get_objective", "loss_of"]


@runtime_checkable
class Loss(Protocol):
    """The one signature of every objective's loss (further keyword parameters, each with a default, are
    the objective's ``parameters``)."""

    def __call__(
        self, batch: CalibrationBatch, hidden: torch.Tensor, head: Head, reference: Reference | None = None
    ) -> torch.Tensor:
        """Per-sample losses ``[batch.num_samples]``; lower is better."""


LOSSES: NamedTable[Loss] = NamedTable(
    "loss",
    {name: f"{__name__}.{name}:loss" for name in OBJECTIVES},
    interface=Loss,
)
"""Each objective's loss, by its name in :data:`OBJECTIVES`: the function ``loss`` of the module of that
name here (``perplexity.loss``), so adding an objective adds its loss."""


def loss_of(objective: Objective) -> Callable:
    """The loss function of a registered objective (its entry in :data:`LOSSES`).

    Raises:
        UserError: the objective is not registered.
    """
    return LOSSES[get_objective(objective.name).name]


def configured_loss(config: CalibrationConfig, with_kl: bool = True) -> Callable:
    """The per-sample loss a calibration configuration minimises: the objective's loss with its parameters
    (``margin_clip``), plus ``kl_weight`` x KL(dense || pruned) when set (and ``with_kl``)."""
    objective = get_objective(config.objective)
    base = loss_of(objective)
    parameters = {name: getattr(config, name) for name in objective.parameters}
    parameters = {name: value for name, value in parameters.items() if value is not None}
    if parameters:
        base = partial(base, **parameters)
    if not (with_kl and config.kl_weight):
        return base
    from pruning.calibration.objectives.kl import divergence

    weight = config.kl_weight

    def loss_with_kl(batch, hidden, head, reference=None):
        return base(batch, hidden, head, reference) + weight * divergence(batch, hidden, head, reference)

    return loss_with_kl
