"""Exhaustive search: score every removal set of size M (exact; for small N and for tests).

C(N, M) evaluations, so it refuses above ``max_subsets`` (default 20,000) with a one-line error rather
than running for days: C(16, 4) = 1,820 is fine, the study's C(32, 7) = 3.4 million is not.

Only the ten best sets are reported, so the subsets go through one ranking query
(:func:`~pruning.search.base.rank_lowest`): the evaluator may stop scoring a subset whose loss is bound
to exceed the tenth best, which changes neither the optimum nor the ten reported.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from tqdm.auto import tqdm

from depthprune.core.errors import UserError
from pruning.search.base import (
    SearchResult,
    SubsetObjective,
    as_key,
    check_budget,
    finish,
    parse_options,
    rank_lowest,
)

REPORTED = 10
"""How many of the best subsets the history lists (the ranking query keeps exactly these)."""


DETERMINISTIC = True
"""Whether the result is the same under every seed (the single-block prior): the seed is ignored."""


@dataclass
class Options:
    """Settings of exhaustive search."""

    max_subsets: int = 20_000
    """Refuse (UserError) when C(N, M) exceeds this."""

    def __post_init__(self):
        if not isinstance(self.max_subsets, int) or self.max_subsets < 1:
            raise ValueError(f"max_subsets must be a positive integer, got {self.max_subsets!r}")


def search(
    objective: SubsetObjective, budget: int, *, seed: int = 0, progress: bool = True, **options
) -> SearchResult:
    """Score all C(N, M) removal sets and return the best (ties: lexicographically first).

    Args:
        objective: scores removal sets (lower is better).
        budget: M, the number of blocks to remove.
        seed: unused (deterministic).
        progress: show a progress bar over the subsets.
        **options: see :class:`Options`.

    Returns:
        The optimal removal set, its loss, and the ten best sets as history.
    """
    settings = parse_options(Options, options, "exhaustive")
    check_budget(objective, budget)
    count = math.comb(objective.num_blocks, budget)
    if count > settings.max_subsets:
        raise UserError(
            f"exhaustive search would score C({objective.num_blocks}, {budget}) = {count:,} "
            f"subsets, more than max_subsets={settings.max_subsets:,}; use another search"
        )
    subsets = list(itertools.combinations(range(objective.num_blocks), budget))
    with tqdm(total=count, desc="exhaustive", disable=not progress, leave=False) as bar:
        answers = rank_lowest(objective, [as_key(subset) for subset in subsets], keep=min(REPORTED, count))
        bar.update(count)
    losses = {subset: answer.loss for subset, answer in zip(subsets, answers) if answer.exact}
    ranked = sorted(losses, key=lambda subset: (losses[subset], subset))
    history = [
        {"rank": rank, "removed": list(subset), "loss": losses[subset]}
        for rank, subset in enumerate(ranked[:REPORTED])
    ]
    return finish(objective, ranked[0], history, settings)
