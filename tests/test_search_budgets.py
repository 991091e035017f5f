"""Search budgets in subset evaluations (issue 55 item 1): how each of the seven maps a budget, and
``-o SEARCH.evaluations=E|greedy`` resolved where a run is planned."""

from __future__ import annotations

import pytest

from ground.core.errors import UserError
from pruning.search import SEARCHES
from pruning.search.budgets import budget_options, greedy_evaluations, resolve_options
from pruning.search.cbo import search as cbo_search


def test_greedy_scores_one_block_extensions_of_every_step():
    assert greedy_evaluations(30, 8) == 212  # the SmolLM2 study's greedy cells
    assert greedy_evaluations(30, 7) == 189 and greedy_evaluations(30, 10) == 255


def test_each_search_maps_a_budget_to_its_own_settings():
    assert budget_options("cbo", 212, 30, 8) == {"keep": 212}
    assert budget_options("bayesian", 212, 30, 8) == {"trials": 212}
    assert budget_options("beam", 5 * 212, 30, 8) == {"width": 5}
    # the GA: population 16, 3 elites: 16 + g·13 <= 212
    assert budget_options("genetic", 212, 30, 8) == {"generations": 15}
    assert budget_options("genetic", 212, 30, 8, {"population": 8}) == {"generations": 34}  # 2 elites
    assert budget_options("cbo", 10**9, 8, 3) == {"keep": 56}  # never more states than exist


@pytest.mark.parametrize("search", ["one_shot", "greedy", "fast_block_select"])
def test_searches_whose_count_is_fixed_refuse_a_budget(search):
    with pytest.raises(UserError, match="takes no budget"):
        budget_options(search, 100, 30, 8)


def test_greedy_matched_budget_resolves_and_explicit_settings_win():
    assert resolve_options("cbo", {"evaluations": "greedy"}, 30, 8) == {"keep": 212}
    assert resolve_options("cbo", {"evaluations": 50, "keep": 7}, 30, 8) == {"keep": 7}
    assert resolve_options("cbo", {"keep": 7}, 30, 8) == {"keep": 7}
    with pytest.raises(UserError, match="positive integer or 'greedy'"):
        resolve_options("cbo", {"evaluations": "lots"}, 30, 8)


def test_cbo_at_a_matched_budget_scores_that_many_sets():
    """A synthetic objective: CBO re-ranks ``keep`` states and every one is a distinct scored set."""
    import numpy as np

    from pruning.search.base import TrackedObjective

    class Additive:
        num_blocks = 10

        def __init__(self):
            self.costs = np.arange(10, dtype=float)

        def score(self, removed):
            return float(sum(self.costs[list(removed)]))

        def residual_gradients(self):
            rng = np.random.default_rng(0)
            return rng.normal(size=(4, 10))

    tracked = TrackedObjective(Additive())
    result = cbo_search(
        tracked, 3, progress=False, **resolve_options("cbo", {"evaluations": "greedy"}, 10, 3)
    )
    assert len(tracked.requested) == greedy_evaluations(10, 3) == 27
    assert result.options["keep"] == 27 and "cbo" in SEARCHES
