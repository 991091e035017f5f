"""One-shot top-M: remove the M blocks whose single-block ablation hurts the calibration loss least.

The study's cheapest baseline (Shortened-LLM's one-shot PPL criterion, generalised to any objective).
It costs the N single-block evaluations of the shared prior plus one score of the chosen set, and it
is exact when the objective is additive over blocks; interactions between removed blocks are ignored.
"""

from __future__ import annotations

from dataclasses import dataclass

from pruning.search.base import (
    SearchResult,
    SubsetObjective,
    check_budget,
    check_prior_kind,
    finish,
    lowest,
    parse_options,
    prior_scores,
)


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
    scores = prior_scores(objective, settings.prior, seed)
    removed = lowest(scores, budget)
    history = [{"step": 0, "prior": [float(value) for value in scores], "removed": removed}]
    return finish(objective, removed, history, settings)
