"""Search budgets in subset evaluations: how many removal sets each of the seven scores, and how to set it.

The study compares searches whose costs differ by two orders of magnitude at their defaults (SmolLM2-135M,
N = 30, M = 8: CBO re-ranks 10 sets, greedy scores 212, beam about 890). A budget of ``evaluations`` distinct
removal sets maps to each search's own settings as far as its algorithm allows:

========================  ==============================================================================
search                    how a budget of E subset evaluations maps
========================  ==============================================================================
``one_shot``              fixed: the N single-block sets (the prior) and the chosen set, N + 1
``greedy``                fixed: Σ_{k<M} (N − k) one-block extensions (212 at N = 30, M = 8)
``beam``                  ``width`` = max(1, round(E / greedy's count)): each step extends ``width`` bases
``genetic``               ``generations`` = max(0, ⌊(E − population) / (population − elites)⌋)
``bayesian``              ``trials`` = E (repeated trials are memoised, so distinct sets can be fewer)
``cbo``                   ``keep`` = E lowest-energy states re-ranked by the true loss (its gradients are
                          one backward pass, no subset evaluation)
``fast_block_select``     fixed by its procedure: the prior, K segments and one or two sets per round
========================  ==============================================================================

``-o SEARCH.evaluations=E`` (an integer) or ``-o SEARCH.evaluations=greedy`` (greedy's count at the run's N
and M) on ``prune`` or ``study`` sets a search's budget this way (:func:`resolve_options`, called where the
run is planned); an option named explicitly beside it wins. The searches marked fixed refuse a budget.
"""

from __future__ import annotations

import math
from typing import Any

from ground.core.errors import UserError

BUDGET_OPTION = "evaluations"
"""The option name that sets a search's budget in subset evaluations (translated, never passed on)."""

MATCH_GREEDY = "greedy"
"""``evaluations=greedy``: greedy's count at the run's N and M (:func:`greedy_evaluations`)."""

FIXED = {
    "one_shot": "the N single-block sets and the chosen set",
    "greedy": "Σ_{k<M} (N − k) one-block extensions",
    "fast_block_select": "the prior, K segment scores and one or two sets per swap round",
}
"""Searches whose number of subset evaluations follows from N and M alone: what it is."""


def greedy_evaluations(num_blocks: int, drop: int) -> int:
    """Subset evaluations of greedy elimination: N + (N − 1) + ... + (N − M + 1)."""
    return sum(num_blocks - step for step in range(drop))


def _genetic(evaluations: int, options: dict) -> dict:
    from pruning.search.genetic import Options

    defaults = Options(**{k: v for k, v in options.items() if k in Options.__dataclass_fields__})
    elites = max(1, round(defaults.elitism * defaults.population))
    per_generation = max(1, defaults.population - elites)
    return {"generations": max(0, (evaluations - defaults.population) // per_generation)}


def budget_options(
    search: str, evaluations: int, num_blocks: int, drop: int, options: dict | None = None
) -> dict[str, Any]:
    """The settings of ``search`` that spend about ``evaluations`` subset evaluations (module table).

    Args:
        search: one of the seven searches (or another with a budget mapping).
        evaluations: the budget, distinct removal sets.
        num_blocks: N.
        drop: M.
        options: the search's other options (the GA's population and elitism decide its generations).

    Raises:
        UserError: a search whose count is fixed, one without a mapping, or a budget below 1.
    """
    if isinstance(evaluations, bool) or not isinstance(evaluations, int) or evaluations < 1:
        raise UserError(f"{search}: evaluations must be a positive integer or 'greedy', got {evaluations!r}")
    if search in FIXED:
        raise UserError(
            f"{search} takes no budget of subset evaluations: it scores {FIXED[search]} (fixed by N and M)"
        )
    mappings = {
        "beam": lambda: {"width": max(1, round(evaluations / greedy_evaluations(num_blocks, drop)))},
        "genetic": lambda: _genetic(evaluations, options or {}),
        "bayesian": lambda: {"trials": evaluations},
        "cbo": lambda: {"keep": min(evaluations, math.comb(num_blocks, drop))},
    }
    if search not in mappings:
        raise UserError(f"{search} has no mapping from a budget of subset evaluations to its settings")
    return mappings[search]()


def resolve_options(search: str, options: dict, num_blocks: int, drop: int) -> dict[str, Any]:
    """``options`` with ``evaluations`` (an integer or ``greedy``) replaced by the search's own settings;
    settings given beside it win. Options without it come back unchanged (a copy).

    Raises:
        UserError: as :func:`budget_options`, or an ``evaluations`` value that is neither.
    """
    chosen = dict(options)
    if BUDGET_OPTION not in chosen:
        return chosen
    wanted = chosen.pop(BUDGET_OPTION)
    if wanted == MATCH_GREEDY:
        wanted = greedy_evaluations(num_blocks, drop)
    return {**budget_options(search, wanted, num_blocks, drop, chosen), **chosen}
