"""Synthetic subset objectives: what the searches see, without a model, with an optimum brute force knows.

A search sees only ``score(removed) -> float`` plus the optional extras of
:class:`pruning.search.base.SubsetObjective`; these objectives provide all of them in microseconds, so the
search contract (``tests/test_search_contract.py``) and the search runner's tests run every algorithm on
many seeds::

    objective = SyntheticObjective(num_blocks=10, interaction=1.0, seed=0)
    result = SEARCHES["greedy"](objective, 4, seed=0, progress=False)
    objective.loss(result.removed_blocks)   # the same value, without counting it as a score
"""

from __future__ import annotations

import itertools

import numpy as np

__all__ = ["ScreenedSyntheticObjective", "SyntheticObjective"]


class SyntheticObjective:
    """L(S) = dense + Σ_{i∈S} cost_i + Σ_{i<j∈S} interaction_ij over ``num_blocks`` blocks.

    ``residual_gradients`` are per-sample noisy copies of −cost (removing block i moves α_i from 1 to 0
    and raises sample s's loss by ≈ cost_i), so H = AᵀA/m ≈ cost·costᵀ and CBO's surrogate prefers cheap
    blocks. ``block_influence`` is monotone in cost (blocks that change their input least are cheapest), and
    ``block_input_similarity`` places each block's input on an arc turned by the blocks' costs.
    Counts how often each thing is computed, to check that searches share work.

    Args:
        num_blocks: blocks in the stack.
        interaction: scale of the pairwise terms; 0 makes the objective additive (every search finds the
            optimum).
        seed: seed of the costs, interactions and gradients.
        samples: rows of ``residual_gradients``.
    """

    def __init__(self, num_blocks: int = 10, interaction: float = 0.0, seed: int = 0, samples: int = 32):
        rng = np.random.default_rng(seed)
        self.num_blocks = num_blocks
        self.dense = 2.0
        self.costs = rng.uniform(0.05, 1.0, num_blocks)
        pairs = rng.normal(0.0, 0.15, (num_blocks, num_blocks))
        for block in range(num_blocks - 1):
            # Neighbours interact most: removing two adjacent blocks is often cheaper than the sum.
            pairs[block, block + 1] = rng.normal(-0.35, 0.25)
        self.interactions = interaction * np.triu(pairs, 1)
        self.gradients = -self.costs[None, :] * (1.0 + 0.05 * rng.standard_normal((samples, num_blocks)))
        self.scored: dict[frozenset[int], int] = {}
        """How often each removal set was scored."""
        self.prior_computations = 0
        """How often the single-block prior was computed (it is memoised, as the real scorer's is)."""
        self._prior: np.ndarray | None = None

    def loss(self, removed) -> float:
        """The objective's value for ``removed``, not counted as a score."""
        blocks = sorted(removed)
        value = self.dense + float(self.costs[blocks].sum())
        for first, second in itertools.combinations(blocks, 2):
            value += float(self.interactions[first, second])
        return value

    def score(self, removed_blocks: frozenset[int]) -> float:
        """The loss of ``removed_blocks``, counted in :attr:`scored`."""
        removed = frozenset(removed_blocks)
        assert all(isinstance(block, int) and 0 <= block < self.num_blocks for block in removed)
        self.scored[removed] = self.scored.get(removed, 0) + 1
        return self.loss(removed)

    def single_block_scores(self) -> np.ndarray:
        """The loss of removing each block alone (memoised)."""
        if self._prior is None:
            self.prior_computations += 1
            self._prior = np.array([self.score(frozenset({block})) for block in range(self.num_blocks)])
        return self._prior.copy()

    def residual_gradients(self) -> np.ndarray:
        """Per-sample gradients of the loss with respect to each block's residual scale (samples × blocks)."""
        return self.gradients.copy()

    def block_influence(self) -> np.ndarray:
        """ShortGPT's Block Influence per block, monotone in the block's cost."""
        return 0.5 * self.costs / self.costs.max()

    def block_input_similarity(self) -> np.ndarray:
        """``[N, N]`` cosines between block inputs of a residual stream that turns as far as a block costs.

        The input of block i sits at the angle θ_i = (π/2)·Σ_{k<i} cost_k / Σ_k cost_k, and S[i, j] =
        cos(θ_i − θ_j): a cheap block barely changes its input (as Block Influence says) and a cheap
        contiguous run keeps the states at its two ends alike (LLM-Streamline's criterion). Symmetric, unit
        diagonal, in [0, 1]; the pairwise interactions play no part (as hidden states cannot see them).
        """
        angles = np.concatenate([[0.0], np.cumsum(self.costs)[:-1]]) * (np.pi / 2) / self.costs.sum()
        return np.cos(angles[:, None] - angles[None, :])


class ScreenedSyntheticObjective(SyntheticObjective):
    """Adds EvoPress-style cheap screening: the loss plus a little noise (a smaller calibration sample)."""

    def screen_score(self, removed_blocks: frozenset[int]) -> float:
        """The loss of ``removed_blocks`` plus noise fixed by the set, not counted as a score."""
        noise = np.random.default_rng(sorted(removed_blocks)).normal(0.0, 0.02)
        return self.loss(removed_blocks) + float(noise)
