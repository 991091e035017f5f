"""The contract between the searches and whatever scores a removal set.

A search sees only a :class:`SubsetObjective`: it never touches a model (style.md rule 3). The real
implementation is :class:`pruning.evaluator.SubsetEvaluator`; tests use small synthetic objectives.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class SubsetObjective(Protocol):
    """What a search may ask of the calibration configuration."""

    num_blocks: int
    """N, the number of decoder blocks of the dense model."""

    def score(self, removed_blocks: frozenset[int]) -> float:
        """Calibration loss of the model with ``removed_blocks`` skipped (lower is better); memoised."""

    def single_block_scores(self) -> np.ndarray:
        """``[N]`` losses with exactly block i removed: the prior of one-shot, GA and BO, computed once."""

    def residual_gradients(self) -> np.ndarray:
        """``[m, N]`` per-sample gradients dL_s/dα_i of the loss w.r.t. a scalar α_i on block i's residual
        branch, at α = 1 (block output = h + α_i·f_i(h)): CBO's matrix A."""

    def block_influence(self) -> np.ndarray:
        """``[N]`` ShortGPT Block Influence, 1 − mean cos(h_in, h_out) per block on the calibration data."""


@dataclass
class SearchResult:
    """What every search returns."""

    removed_blocks: tuple[int, ...]
    """The chosen removal set, sorted."""
    loss: float
    """``objective.score(removed_blocks)``."""
    history: list[dict] = field(default_factory=list)
    """Per step or generation: what was tried and the best so far (for plots and resumption)."""
    options: dict = field(default_factory=dict)
    """The algorithm's settings as used (stored in the registry)."""
