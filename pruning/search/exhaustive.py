"""Exhaustive search: score every removal set of size M (exact; for small N and for tests).

C(N, M) evaluations, so it refuses above ``max_subsets`` (default 20,000) with a one-line error rather
than running for days: C(16, 4) = 1,820 is fine, the study's C(32, 7) = 3.4 million is not.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from tqdm.auto import tqdm

from depthprune.errors import UserError
from pruning.search.base import SearchResult, SubsetObjective, as_key, check_budget, finish, parse_options


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
    losses = {}
    subsets = itertools.combinations(range(objective.num_blocks), budget)
    for subset in tqdm(subsets, total=count, desc="exhaustive", disable=not progress, leave=False):
        losses[subset] = objective.score(as_key(subset))
    ranked = sorted(losses, key=lambda subset: (losses[subset], subset))
    history = [
        {"rank": rank, "removed": list(subset), "loss": losses[subset]}
        for rank, subset in enumerate(ranked[:10])
    ]
    return finish(objective, ranked[0], history, settings)
