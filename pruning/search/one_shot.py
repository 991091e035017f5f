"""One-shot top-M: remove the M blocks whose single-block ablation hurts the calibration loss least.

The study's cheapest baseline (Shortened-LLM's one-shot PPL criterion, generalised to any objective).
It costs the N single-block evaluations of the shared prior plus one score of the chosen set, and it
is exact when the objective is additive over blocks; interactions between removed blocks are ignored.

Only the M lowest single-block losses matter, so the prior is a ranking query
(:func:`~pruning.search.base.rank_prior`): when the prior is not computed yet, the evaluator may stop
scoring a block whose loss is bound to exceed the M-th lowest. The history then gives that block's lower
bound in ``prior`` and lists it under ``stopped``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pruning.search.base import (
    SearchResult,
    SubsetObjective,
    check_budget,
    check_prior_kind,
    finish,
    lowest,
    parse_options,
    prior_scores,
    rank_prior,
)

DETERMINISTIC = True
"""Whether the result is the same under every seed (the single-block prior): it removes the M lowest
single-block scores; the seed is used only by the random-prior control."""


@dataclass
class Options:
    """Settings of the one-shot search."""

    prior: str = "single_block"
    """``single_block`` (the study's) or ``random`` (a seeded random ranking: the control)."""

    def __post_init__(self):
        check_prior_kind(self.prior)


def search(
    objective: SubsetObjective, budget: int, *, seed: int = 0, progress: bool = True, **options
) -> SearchResult:
    """Remove the ``budget`` blocks with the lowest prior score.

    Args:
        objective: scores removal sets (lower is better).
        budget: M, the number of blocks to remove.
        seed: only used by ``prior="random"``.
        progress: unused (the prior is computed by the evaluator with its own progress bar).
        **options: see :class:`Options`.

    Returns:
        The removal set, its calibration loss, the prior as history.
    """
    settings = parse_options(Options, options, "one_shot")
    check_budget(objective, budget)
    if settings.prior == "single_block":
        ranked = rank_prior(objective, budget)
        if len(ranked) != objective.num_blocks:
            raise ValueError(f"the prior has {len(ranked)} entries, expected {objective.num_blocks}")
        # A lower bound is above the M-th lowest loss: it never makes the M lowest.
        scores = np.array([answer.loss for answer in ranked], dtype=np.float64)
        stopped = [block for block, answer in enumerate(ranked) if not answer.exact]
    else:
        scores, stopped = prior_scores(objective, settings.prior, seed), []
    removed = lowest(scores, budget)
    history = [{"step": 0, "prior": [float(value) for value in scores], "removed": removed}]
    if stopped:
        history[0]["stopped"] = stopped
    return finish(objective, removed, history, settings)
