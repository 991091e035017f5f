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

from ground.core.errors import UserError
from pruning.search import base

REPORTED = 10
"""How many of the best subsets the history lists (the ranking query keeps exactly these)."""


@dataclass
class Options(base.SearchOptions):
    """Settings of exhaustive search."""

    max_subsets: int = base.integer(20_000)
    """Refuse (UserError) when C(N, M) exceeds this, rather than score for days (C(16, 4) = 1,820 runs; the
    study's C(32, 7) = 3.4 million does not)."""


@base.define_search(Options, deterministic=True)
def search(
    objective: base.SubsetObjective, budget: int, settings: Options, seed: int, progress: bool
) -> base.SearchResult:
    """Score all C(N, M) removal sets and return the best (ties: lexicographically first).

    The seed is unused (deterministic); the progress bar counts the subsets.

    Returns:
        The optimal removal set, its loss, and the ten best sets as history.
    """
    count = math.comb(objective.num_blocks, budget)
    if count > settings.max_subsets:
        raise UserError(
            f"exhaustive search would score C({objective.num_blocks}, {budget}) = {count:,} "
            f"subsets, more than max_subsets={settings.max_subsets:,}; use another search"
        )
    subsets = list(itertools.combinations(range(objective.num_blocks), budget))
    with tqdm(total=count, desc="exhaustive", disable=not progress, leave=False) as bar:
        keys = [base.as_key(subset) for subset in subsets]
        answers = base.rank_lowest(objective, keys, keep=min(REPORTED, count))
        bar.update(count)
    losses = {subset: answer.loss for subset, answer in zip(subsets, answers) if answer.exact}
    ranked = sorted(losses, key=lambda subset: (losses[subset], subset))
    history = [
        {"rank": rank, "removed": list(subset), "loss": losses[subset]}
        for rank, subset in enumerate(ranked[:REPORTED])
    ]
    return base.finish(objective, ranked[0], history, settings)
