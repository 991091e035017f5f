"""``kl``: KL(dense ‖ pruned) of the next-token distribution, averaged over a window's positions (EvoPress).

``reference(row)`` gives the dense model's log-probabilities ``[positions, vocab]`` of one sequence's real
(non-padding) positions. :func:`divergence` is also the term ``--kl-weight`` adds to any other objective: on
multiple-choice data it averages over the prompt and answer positions of every choice sequence of an item.
Facts (its zero gradient at the dense model, its loss floor): ``ground.core.objectives.OBJECTIVES["kl"]``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pruning.calibration.objectives.batches import (
    CalibrationBatch,
    Head,
    Reference,
    as_loss_dtype,
    chunked,
    sum_by_index,
)

if TYPE_CHECKING:
    import torch


def divergence(
    batch: CalibrationBatch, hidden: torch.Tensor, head: Head, reference: Reference | None
) -> torch.Tensor:
    """Mean KL(dense ‖ pruned) per sample ``[num_samples]``: per text window, or per multiple-choice item
    over all positions of its choice sequences. The LM head runs row by row, in chunks."""
    import torch
    import torch.nn.functional as F

    if reference is None:
        raise ValueError("KL to the dense model needs the dense model's log-probabilities")
    sums, lengths = [], []
    for row in range(hidden.shape[0]):
        dense_logprobs = reference(row)
        positions = dense_logprobs.shape[0]
        total = as_loss_dtype(hidden.new_zeros(()))
        for start, chunk in chunked(hidden[row, :positions]):
            logprobs = torch.log_softmax(as_loss_dtype(head(chunk)), dim=-1)
            dense = dense_logprobs[start : start + chunk.shape[0]].to(logprobs.device, logprobs.dtype)
            total = total + F.kl_div(logprobs, dense, log_target=True, reduction="sum")
        sums.append(total)
        lengths.append(positions)
    sums = torch.stack(sums)
    lengths = torch.tensor(lengths, dtype=sums.dtype, device=sums.device)
    if batch.sequence_item is None:
        return sums / lengths
    item = batch.sequence_item.to(sums.device)
    # sum_by_index: the same bits on every CUDA run (index_add's atomics are not).
    return sum_by_index(sums, item, batch.num_samples) / sum_by_index(lengths, item, batch.num_samples)


def loss(
    batch: CalibrationBatch, hidden: torch.Tensor, head: Head, reference: Reference | None = None
) -> torch.Tensor:
    """Mean KL(dense ‖ pruned) of the next-token distribution per text window ``[num_samples]``."""
    return divergence(batch, hidden, head, reference)
