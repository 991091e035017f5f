"""Depth-pruning searches: every algorithm is one function with one signature, listed in ``SEARCHES``.

``SEARCHES[name](objective, budget, *, seed=0, progress=True, **options) -> SearchResult``; the key is
the module's file name. Searches see only a :class:`SubsetObjective` (never a model). ``SEARCHES`` is a
:class:`~ground.core.registry_table.NamedTable`: a search's module is imported when it is first asked
for, and checked against the :class:`~pruning.search.base.Search` interface then.

Three groups: the study's seven (``STUDY_SEARCHES``: one_shot, greedy, beam, genetic, bayesian, cbo,
fast_block_select); the similarity baselines, one-shot criteria on the hidden states of the evaluator's
dense pass that never look at the calibration loss while choosing (block_influence, ShortGPT; lorp, LoRP;
streamline, LLM-Streamline's contiguous run); and the extras (evolution, EvoPress; exhaustive, the exact
optimum for small N). ``ALL_SEARCHES`` (``--search all``) is every one but exhaustive.

The tables that follow from the searches (``MODULES``, ``OPTIONS``, ``OBJECTIVE_CHECKS``, ``PRIOR_GUIDED``,
``DETERMINISTIC``) are built on first use, so that naming the searches (``--help``) imports none of them.
"""

from __future__ import annotations

import importlib
from functools import cache

from ground.core.registry_table import NamedTable
from pruning.search.base import (
    CalibratedObjective,
    ScreeningObjective,
    Search,
    SearchResult,
    SubsetObjective,
    TrackedObjective,
)

SEARCHES: NamedTable[Search] = NamedTable(
    "search",
    {
        "one_shot": "pruning.search.one_shot:search",
        "greedy": "pruning.search.greedy:search",
        "beam": "pruning.search.beam:search",
        "genetic": "pruning.search.genetic:search",
        "bayesian": "pruning.search.bayesian:search",
        "cbo": "pruning.search.cbo:search",
        "fast_block_select": "pruning.search.fast_block_select:search",
        "block_influence": "pruning.search.block_influence:search",
        "lorp": "pruning.search.lorp:search",
        "streamline": "pruning.search.streamline:search",
        "evolution": "pruning.search.evolution:search",
        "exhaustive": "pruning.search.exhaustive:search",
    },
    interface=Search,
)
"""name -> search function: the one registry (add a search: one module plus one line here). The study's
seven first, then the similarity baselines, then the extras."""

STUDY_SEARCHES = ("one_shot", "greedy", "beam", "genetic", "bayesian", "cbo", "fast_block_select")
"""The seven algorithms compared by the study (arXiv 2604.24938)."""

ALL_SEARCHES = tuple(name for name in SEARCHES if name != "exhaustive")
"""What ``--search all`` runs: every algorithm but ``exhaustive`` (infeasible beyond small N)."""


def _every(fact: str) -> dict:
    return {name: getattr(SEARCHES[name], fact) for name in SEARCHES}


_DERIVED = {
    "MODULES": lambda: {
        name: importlib.import_module(module) for name, module in _every("__module__").items()
    },
    "OPTIONS": lambda: _every("options_class"),
    "OBJECTIVE_CHECKS": lambda: {name: check for name, check in _every("check_objective").items() if check},
    "PRIOR_GUIDED": lambda: frozenset(
        name for name, options in _every("options_class").items() if "prior" in options.__dataclass_fields__
    ),
    "DETERMINISTIC": lambda: frozenset(name for name, fixed in _every("deterministic").items() if fixed),
}
"""The tables read off the searches (each one's :class:`~pruning.search.base.Search` facts), built on first
access (module ``__getattr__``), so that naming the searches imports none of them:

* ``MODULES`` — name -> the search's module;
* ``OPTIONS`` — name -> the dataclass of the search's options (field docstrings are the documentation);
* ``OBJECTIVE_CHECKS`` — name -> ``check_objective(objective)`` of the searches that cannot run under some
  calibration objectives: it raises a one-line :class:`~ground.core.errors.UserError` for those (asked
  before any model is loaded);
* ``PRIOR_GUIDED`` — searches that take ``prior="random"`` (the random-prior control);
* ``DETERMINISTIC`` — searches whose result does not depend on the seed under the single-block prior: a
  study with a pinned calibration draw runs them once and reuses that cell for its other seeds. A random
  prior is seeded, so :func:`uses_seed` is what to ask.
"""


@cache
def __getattr__(name: str):
    if name not in _DERIVED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return _DERIVED[name]()


def uses_seed(name: str, options: dict | None = None, *, random_prior: bool = False) -> bool:
    """Whether search ``name`` with ``options`` can give another result under another seed: a stochastic
    search, or a prior-guided one under the seeded random prior (``random_prior`` or ``prior="random"``)."""
    randomised = random_prior or (options or {}).get("prior") == "random"
    return name not in __getattr__("DETERMINISTIC") or (randomised and name in __getattr__("PRIOR_GUIDED"))


__all__ = [
    "ALL_SEARCHES",
    "CalibratedObjective",
    "DETERMINISTIC",
    "MODULES",
    "OBJECTIVE_CHECKS",
    "OPTIONS",
    "PRIOR_GUIDED",
    "SEARCHES",
    "STUDY_SEARCHES",
    "ScreeningObjective",
    "Search",
    "SearchResult",
    "SubsetObjective",
    "TrackedObjective",
    "uses_seed",
]
