"""What the subset evaluator measures besides losses: its work counters, and the dense pass's statistics.

:class:`EvaluatorStats` is what the registry stores per search (block forwards, tokens, memo hits, times).
:func:`input_similarity_sums` accumulates LoRP's block-input similarity during the dense reference pass.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

SIMILARITY_CHUNK_ELEMENTS = 2**25
"""Floats per chunk of the block-input similarity (blocks × positions × hidden): 128 MiB in float32."""


@dataclass
class EvaluatorStats:
    """Work counters of one evaluator; the registry stores them per search."""

    block_forwards: int = 0
    """Decoder-block calls, each on one batch of sequences (a full pass over the data costs N × batches)."""
    tokens: int = 0
    """Token positions run through decoder blocks, summed over block calls (padding included)."""
    evaluations: int = 0
    """Removal sets actually scored (distinct ones, as repeats hit the memo; naive mode scores every call)."""
    memo_hits: int = 0
    """Scores answered from the memo."""
    head_positions: int = 0
    """Positions sent through the LM head."""
    stopped_early: int = 0
    """Ranking answers given by a lower bound: candidates whose scoring stopped before the last batch."""
    bounds_completed: int = 0
    """Stopped candidates later scored to the end because their value was asked for."""
    wall_seconds: float = 0.0
    """Wall time spent scoring, in gradients, and in a dense pass that naive mode runs only when Block
    Influence or the block-input similarity is asked for (start-up excluded)."""
    setup_seconds: float = 0.0
    """Wall time of start-up: data, model and the dense reference pass."""
    reference_seconds: float = 0.0
    """Wall time of the dense reference pass alone (part of ``setup_seconds``)."""
    similarity_seconds: float = 0.0
    """Wall time of the block-input similarity matrix (part of ``reference_seconds``)."""

    @contextmanager
    def scoring(self) -> Iterator[None]:
        """Count the wall time of the ``with`` body as scoring time (:attr:`wall_seconds`)."""
        start = time.perf_counter()
        yield
        self.wall_seconds += time.perf_counter() - start


def input_similarity_sums(
    block_inputs: list[torch.Tensor], weight: torch.Tensor, device: torch.device
) -> torch.Tensor:
    """``[N, N]`` Σ_t w_t · x̂_i,t · x̂_j,t over one batch's real positions (LoRP eqs. 3-4, unnormalised).

    Args:
        block_inputs: the N hidden states entering the blocks, ``[rows, width, hidden]`` each.
        weight: ``[rows, width]`` token weights (0 on padding, which is therefore left out).

    Returns:
        The weighted sums of per-token cosines, float64 on the CPU.
    """
    hidden_size = block_inputs[0].shape[-1]
    flat_weight = weight.reshape(-1)
    real_positions = torch.nonzero(flat_weight > 0).flatten()
    per_chunk = max(1, SIMILARITY_CHUNK_ELEMENTS // (len(block_inputs) * hidden_size))
    sums = torch.zeros(len(block_inputs), len(block_inputs), dtype=torch.float64)
    for positions in real_positions.split(per_chunk):
        features = torch.stack(
            [
                state.reshape(-1, hidden_size)[positions.to(state.device)].to(device).float()
                for state in block_inputs
            ]
        )
        # LoRP's per-token L2 normalisation, eps included (a zero state contributes 0, not NaN).
        features = features / (features.norm(dim=-1, keepdim=True) + 1e-8)
        weighted = features * flat_weight[positions].to(features.dtype)[None, :, None]
        sums += torch.einsum("icd,jcd->ij", weighted, features).double().cpu()
    return sums
