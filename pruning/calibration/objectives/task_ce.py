"""``task_ce``: length-normalised cross-entropy of the correct answer text on multiple-choice items.

Per item, the mean negative log-probability of the correct choice's answer tokens given ``"Question:
{context}\\nAnswer:"`` (−ℓ_c in :mod:`.task_margin`'s notation): the bounded likelihood objective. Unlike the
margin it cannot improve by making the wrong answers less likely, and it is never below 0 (its loss floor,
so ranking queries stop early). Only the answer positions of the correct choices go through the LM head.
Facts: ``ground.core.objectives.OBJECTIVES["task_ce"]``.
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


def loss(
    batch: CalibrationBatch, hidden: torch.Tensor, head: Head, reference: Reference | None = None
) -> torch.Tensor:
    """Mean NLL of the correct answer's tokens per multiple-choice item ``[num_samples]``."""
    import torch
    import torch.nn.functional as F

    correct = torch.zeros(hidden.shape[0], dtype=torch.bool, device=batch.answer_rows.device)
    correct[batch.correct_sequence] = True
    keep = correct[batch.answer_rows]
    rows, positions, tokens = batch.answer_rows[keep], batch.answer_positions[keep], batch.answer_tokens[keep]
    answer_hidden = hidden[rows, positions]
    nll = []
    for start, chunk in chunked(answer_hidden):
        logits = as_loss_dtype(head(chunk))
        nll.append(F.cross_entropy(logits, tokens[start : start + chunk.shape[0]], reduction="none"))
    token_nll = torch.cat(nll)
    row_sum = sum_by_index(token_nll, rows, hidden.shape[0])  # deterministic on CUDA too
    row_len = sum_by_index(torch.ones_like(token_nll), rows, hidden.shape[0])
    correct_rows = batch.correct_sequence
    return row_sum[correct_rows] / row_len[correct_rows]
