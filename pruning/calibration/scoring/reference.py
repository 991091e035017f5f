"""The KL reference: what the subset evaluator keeps of the dense model's next-token distribution.

``kl`` (and any ``--kl-weight`` term) compares a pruned model's next-token distribution with the dense one.
The dense log-probabilities (``samples × seq_len × vocab`` floats) are cached once, during the dense
reference pass, when they fit the memory budget next to the boundary cache; otherwise only the dense final
hidden states are kept and the dense LM head is re-run per candidate (for a 128k vocabulary and 64×2048
tokens the log-probabilities would take 64 GiB, the hidden states 2 GiB). Either way a loss sees the same
``row -> dense log-probs [real positions, vocab]`` function (:meth:`KLReference.for_batch`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from pruning.calibration.objectives.batches import CalibrationBatch, chunked

Reference = Callable[[int], torch.Tensor]
"""``row -> dense log-probs [real positions, vocab]`` of one calibration batch."""


class KLReference:
    """Per calibration batch, the dense log-probabilities or final hidden states (:meth:`keep`).

    Args:
        head: the LM head, ``hidden [positions, hidden] -> logits`` (counted by the evaluator).
        device: where the losses are computed.
        cache_device: where what is kept lives (the boundary cache's device).
        keep_logprobs: keep the log-probabilities (they fit the budget), else the final hidden states.
        num_batches: how many calibration batches there are.
    """

    def __init__(
        self,
        head: Callable[[torch.Tensor], torch.Tensor],
        device: torch.device,
        cache_device: torch.device,
        keep_logprobs: bool,
        num_batches: int,
    ):
        self.head = head
        self.device = device
        self.cache_device = cache_device
        self.keep_logprobs = keep_logprobs
        self.stored: list[list[torch.Tensor] | None] = [None] * num_batches
        """Per batch, per sequence: what is kept of the dense pass (None for a batch not kept)."""

    def keep(self, batch_index: int, batch: CalibrationBatch, hidden: torch.Tensor) -> None:
        """Keep, per sequence of ``batch``, the dense final ``hidden`` states' reference on its real
        positions only: the log-probabilities (in LM-head chunks) or the hidden states themselves."""
        lengths = batch.token_mask.sum(dim=1).tolist()
        if not self.keep_logprobs:
            kept = [hidden[row, :length].to(self.cache_device) for row, length in enumerate(lengths)]
        else:
            kept = [
                self._logprobs(hidden[row, :length]).to(self.cache_device)
                for row, length in enumerate(lengths)
            ]
        self.stored[batch_index] = kept

    def for_batch(self, batch_index: int) -> Reference | None:
        """``row -> dense log-probs [real positions, vocab]`` of one batch; None when nothing was kept."""
        stored = self.stored[batch_index]
        if stored is None:
            return None
        if self.keep_logprobs:
            return lambda row: stored[row].to(self.device)

        def recompute(row: int) -> torch.Tensor:
            with torch.no_grad():
                return self._logprobs(stored[row].to(self.device))

        return recompute

    def _logprobs(self, hidden: torch.Tensor) -> torch.Tensor:
        pieces = [torch.log_softmax(self.head(chunk).float(), dim=-1) for _, chunk in chunked(hidden)]
        return torch.cat(pieces)
