"""``task_margin``: PuDDing's task likelihood margin on multiple-choice items.

With ℓ(choice) the mean log-probability of the answer tokens given ``"Question: {context}\\nAnswer:
{choice}"`` (for a fill-in-the-blank item, of the sentence with the blank filled: PuDDing's WinoGrande), an
item with correct choice c scores Σ_{j≠c} (ℓ_c − ℓ_j); its loss is the negated margin (more negative =
better). The choices are answer *texts* (:mod:`pruning.calibration.data.commonsense` parses them out of
Commonsense-170k's instructions). Only the answer positions go through the LM head. Facts:
``ground.core.objectives.OBJECTIVES["task_margin"]``.

``margin_clip`` TAU (``--margin-clip``; default None, PuDDing's margin unchanged) clips each item's margin to
[-TAU, TAU]: the loss is then bounded, and a search gains nothing by pushing a few items' margins ever higher.
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


def answer_logprobs(batch: CalibrationBatch, hidden: torch.Tensor, head: Head) -> torch.Tensor:
    """ℓ per (item, choice) sequence ``[sequences]``: the mean log-probability of its answer tokens.

    The LM head sees the answer positions only."""
    import torch

    answer_hidden = hidden[batch.answer_rows, batch.answer_positions]
    token_logprobs = []
    for start, chunk in chunked(answer_hidden):
        logprobs = torch.log_softmax(as_loss_dtype(head(chunk)), dim=-1)
        tokens = batch.answer_tokens[start : start + chunk.shape[0]]
        token_logprobs.append(logprobs.gather(1, tokens[:, None])[:, 0])
    token_logprobs = torch.cat(token_logprobs)
    sequences = hidden.shape[0]
    answer_sum = sum_by_index(token_logprobs, batch.answer_rows, sequences)
    answer_len = sum_by_index(torch.ones_like(token_logprobs), batch.answer_rows, sequences)
    return answer_sum / answer_len


def loss(
    batch: CalibrationBatch,
    hidden: torch.Tensor,
    head: Head,
    reference: Reference | None = None,
    margin_clip: float | None = None,
) -> torch.Tensor:
    """Negated PuDDing margin per multiple-choice item ``[num_samples]`` (clipped to ±``margin_clip``)."""
    import torch

    mean_logprob = answer_logprobs(batch, hidden, head)  # ℓ per (item, choice) sequence
    items = batch.num_samples
    total = sum_by_index(mean_logprob, batch.sequence_item, items)
    choices = sum_by_index(torch.ones_like(mean_logprob), batch.sequence_item, items)
    # Σ_{j≠c} (ℓ_c − ℓ_j) = k·ℓ_c − Σ_j ℓ_j
    margin = choices * mean_logprob[batch.correct_sequence] - total
    if margin_clip is not None:
        margin = margin.clamp(-margin_clip, margin_clip)
    return -margin
