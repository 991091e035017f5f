"""``perplexity``: mean next-token NLL of a text window (its exp is the perplexity).

All next-token positions go through the LM head, in chunks (:data:`~.batches.HEAD_CHUNK_POSITIONS`).
Facts (data kind, loss floor, synonyms): ``ground.core.objectives.OBJECTIVES["perplexity"]``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pruning.calibration.objectives.batches import CalibrationBatch, Head, Reference, as_loss_dtype, chunked

if TYPE_CHECKING:
    import torch


def loss(
    batch: CalibrationBatch, hidden: torch.Tensor, head: Head, reference: Reference | None = None
) -> torch.Tensor:
    """Mean next-token negative log-likelihood per text window ``[num_samples]``."""
    import torch
    import torch.nn.functional as F

    losses = []
    for row in range(hidden.shape[0]):
        targets = batch.input_ids[row, 1:]
        total = as_loss_dtype(hidden.new_zeros(()))
        for start, chunk in chunked(hidden[row, :-1]):
            logits = as_loss_dtype(head(chunk))
            total = total + F.cross_entropy(logits, targets[start : start + chunk.shape[0]], reduction="sum")
        losses.append(total / targets.shape[0])
    return torch.stack(losses)
