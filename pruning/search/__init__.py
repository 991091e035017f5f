"""Depth-pruning searches: every algorithm is one function with one signature, listed in ``SEARCHES``.

``SEARCHES[name](objective, budget, *, seed=0, progress=True, **options) -> SearchResult``; the key is
the module's file name. Searches see only a :class:`SubsetObjective` (never a model).

Three groups: the study's seven (``STUDY_SEARCHES``: one_shot, greedy, beam, genetic, bayesian, cbo,
fast_block_select); the similarity baselines, one-shot criteria on the hidden states of the evaluator's
dense pass that never look at the calibration loss while choosing (block_influence, ShortGPT; lorp, LoRP;
streamline, LLM-Streamline's contiguous run); and the extras (evolution, EvoPress; exhaustive, the exact
optimum for small N). ``ALL_SEARCHES`` (``--search all``) is every one but exhaustive.
"""

from __future__ import annotations

from pruning.search import (
    bayesian,
    beam,
    block_influence,
    cbo,
    evolution,
    exhaustive,
    fast_block_select,
    genetic,
    greedy,
    lorp,
    one_shot,
    streamline,
)
from pruning.search.base import (
    CalibratedObjective,
    ScreeningObjective,
    SearchResult,
    SubsetObjective,
    TrackedObjective,
)

MODULES = {
    "one_shot": one_shot,
    "greedy": greedy,
    "beam": beam,
    "genetic": genetic,
    "bayesian": bayesian,
    "cbo": cbo,
    "fast_block_select": fast_block_select,
    "block_influence": block_influence,
    "lorp": lorp,
    "streamline": streamline,
    "evolution": evolution,
    "exhaustive": exhaustive,
}
"""name -> the search's module: the one registry (add a search: one module plus one line here). The study's
seven first, then the similarity baselines, then the extras."""

SEARCHES = {name: module.search for name, module in MODULES.items()}
"""name -> search function."""

OPTIONS = {name: module.Options for name, module in MODULES.items()}
"""name -> the dataclass of the search's options (field docstrings are the documentation)."""

OBJECTIVE_CHECKS = {
    name: module.check_objective for name, module in MODULES.items() if hasattr(module, "check_objective")
}
"""name -> ``check_objective(objective)`` of the searches that cannot run under some calibration
objectives: it raises a one-line :class:`~depthprune.core.errors.UserError` for those (asked before any model
is loaded)."""

PRIOR_GUIDED = frozenset(name for name, options in OPTIONS.items() if "prior" in options.__dataclass_fields__)
"""Searches that take ``prior="random"`` (the random-prior control)."""

DETERMINISTIC = frozenset(name for name, module in MODULES.items() if module.DETERMINISTIC)
"""Searches whose result does not depend on the seed under the single-block prior (each module's
``DETERMINISTIC``): a study with a pinned calibration draw runs them once and reuses that cell for its other
seeds. A random prior is seeded, so :func:`uses_seed` is what to ask."""


def uses_seed(name: str, options: dict | None = None, *, random_prior: bool = False) -> bool:
    """Whether search ``name`` with ``options`` can give another result under another seed: a stochastic
    search, or a prior-guided one under the seeded random prior (``random_prior`` or ``prior="random"``)."""
    randomised = random_prior or (options or {}).get("prior") == "random"
    return name not in DETERMINISTIC or (randomised and name in PRIOR_GUIDED)


STUDY_SEARCHES = ("one_shot", "greedy", "beam", "genetic", "bayesian", "cbo", "fast_block_select")
"""The seven algorithms compared by the study (arXiv 2604.24938)."""

ALL_SEARCHES = tuple(name for name in SEARCHES if name != "exhaustive")
"""What ``--search all`` runs: every algorithm but ``exhaustive`` (infeasible beyond small N)."""

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
    "SearchResult",
    "SubsetObjective",
    "TrackedObjective",
    "uses_seed",
]
