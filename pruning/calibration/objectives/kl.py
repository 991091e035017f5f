"""``kl``: KL(dense ‖ pruned) of the next-token distribution, averaged over a window's positions (EvoPress).

``reference(row)`` gives the dense model's log-probabilities ``[seq, vocab]`` of one sequence.
Facts (its zero gradient at the dense model, its loss floor): ``depthprune.core.objectives.OBJECTIVES["kl"]``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pruning.calibration.objectives.batches import CalibrationBatch, Head, Reference, as_loss_dtype, chunked

if TYPE_CHECKING:
    import torch


def loss(
    batch: CalibrationBatch, hidden: torch.Tensor, head: Head, reference: Reference | None = None
) -> torch.Tensor:
    """Mean KL(dense ‖ pruned) of the next-token distribution per text window ``[num_samples]``."""
    import torch
    import torch.nn.functional as F

    if reference is None:
        raise ValueError("the kl objective needs the dense model's log-probabilities")
    losses = []
    for row in range(hidden.shape[0]):
        dense_logprobs = reference(row)
        total = as_loss_dtype(hidden.new_zeros(()))
        for start, chunk in chunked(hidden[row]):
            logprobs = torch.log_softmax(as_loss_dtype(head(chunk)), dim=-1)
            dense = dense_logprobs[start : start + chunk.shape[0]].to(logprobs.device, logprobs.dtype)
            total = total + F.kl_div(logprobs, dense, log_target=True, reduction="sum")
        losses.append(total / hidden.shape[1])
    return torch.stack(losses)
