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

from pruning.search import base


@dataclass
class Options(base.SearchOptions):
    """Settings of the one-shot search."""

    prior: str = base.one_of("single_block", base.PRIOR_KINDS)
    """``single_block`` (the study's) or ``random`` (a seeded random ranking: the control)."""


@base.define_search(Options, deterministic=True)
def search(
    objective: base.SubsetObjective, budget: int, settings: Options, seed: int, progress: bool
) -> base.SearchResult:
    """Remove the ``budget`` blocks with the lowest prior score.

    The seed is used only by ``prior="random"``; no progress bar (the evaluator shows the prior's).

    Returns:
        The removal set, its calibration loss, the prior as history.
    """
    if settings.prior == "single_block":
        ranked = base.rank_prior(objective, budget)
        if len(ranked) != objective.num_blocks:
            raise ValueError(f"the prior has {len(ranked)} entries, expected {objective.num_blocks}")
        # A lower bound is above the M-th lowest loss: it never makes the M lowest.
        scores = np.array([answer.loss for answer in ranked], dtype=np.float64)
        stopped = [block for block, answer in enumerate(ranked) if not answer.exact]
    else:
        scores, stopped = base.prior_scores(objective, settings.prior, seed), []
    removed = base.lowest(scores, budget)
    history = [{"step": 0, "prior": [float(value) for value in scores], "removed": removed}]
    if stopped:
        history[0]["stopped"] = stopped
    return base.finish(objective, removed, history, settings)
