"""The model's blocks and LM head as the subset evaluator runs them, and what each call costs.

Every part of the evaluator that runs the model (the dense reference pass, the trie walk, the KL reference,
the naive full forwards, the residual gradients) goes through one :class:`BlockRunner`, so that the work
counters of :class:`~pruning.calibration.scoring.statistics.EvaluatorStats` count every block call and
every position sent through the LM head, whoever made it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from pruning.calibration.objectives.batches import CalibrationBatch
from pruning.calibration.scoring.fusion import fused_blocks as fuse
from pruning.calibration.scoring.packing import RunBatch
from pruning.calibration.scoring.statistics import EvaluatorStats
from pruning.model.blocks import BlockStack


class BlockRunner:
    """Runs one block or the LM head of ``stack`` and counts the work in ``stats``.

    Args:
        stack: the model.
        stats: the evaluator's work counters.
        fused_blocks: run the blocks through one compiled forward (:mod:`.fusion`, CUDA only).
    """

    def __init__(self, stack: BlockStack, stats: EvaluatorStats, fused_blocks: bool | str = False):
        self.stack = stack
        self.stats = stats
        self.num_blocks = stack.num_blocks
        self.device = stack.device
        # What scoring calls per block: the model's own forwards, or one compiled forward all blocks share.
        self.blocks: Sequence = (
            fuse(stack.blocks, self.device, fused_blocks) if fused_blocks else stack.blocks
        )

    def block(self, index: int, hidden: torch.Tensor, block_kwargs: dict) -> torch.Tensor:
        """The output of block ``index`` for ``hidden`` (moved to the block's card first)."""
        return self.blocks[index](self.stack.to_block_device(index, hidden), **block_kwargs)

    def full_forward(self, batch: CalibrationBatch, removed: frozenset[int]) -> torch.Tensor:
        """The logits of ``batch`` by a full forward with ``removed`` skipped, the LM head on every position
        (naive mode: no cache, no shortcut)."""
        logits = self.stack.forward(batch.input_ids, removed)
        self.count_blocks(batch, self.num_blocks - len(removed))
        self.stats.head_positions += batch.input_ids.numel()
        return logits

    def count_blocks(self, batch: CalibrationBatch | RunBatch, blocks: int) -> None:
        """Count ``blocks`` block calls on ``batch``."""
        self.stats.block_forwards += blocks
        self.stats.tokens += blocks * batch.input_ids.numel()

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """The LM head's logits for ``hidden`` ``[positions, hidden]``, counted per position."""
        self.stats.head_positions += hidden.shape[0]
        return self.stack.head(hidden)
