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
from pruning.search.base import ScreeningObjective, SearchResult, SubsetObjective, TrackedObjective

SEARCHES = {
    "one_shot": one_shot.search,
    "greedy": greedy.search,
    "beam": beam.search,
    "genetic": genetic.search,
    "bayesian": bayesian.search,
    "cbo": cbo.search,
    "fast_block_select": fast_block_select.search,
    "block_influence": block_influence.search,
    "lorp": lorp.search,
    "streamline": streamline.search,
    "evolution": evolution.search,
    "exhaustive": exhaustive.search,
}
"""name -> search function; the study's seven first, then the similarity baselines, then the extras."""

OPTIONS = {
    "one_shot": one_shot.Options,
    "greedy": greedy.Options,
    "beam": beam.Options,
    "genetic": genetic.Options,
    "bayesian": bayesian.Options,
    "cbo": cbo.Options,
    "fast_block_select": fast_block_select.Options,
    "block_influence": block_influence.Options,
    "lorp": lorp.Options,
    "streamline": streamline.Options,
    "evolution": evolution.Options,
    "exhaustive": exhaustive.Options,
}
"""name -> the dataclass of the search's options (field docstrings are the documentation)."""

PRIOR_GUIDED = frozenset(name for name, options in OPTIONS.items() if "prior" in options.__dataclass_fields__)
"""Searches that take ``prior="random"`` (the random-prior control)."""

STUDY_SEARCHES = ("one_shot", "greedy", "beam", "genetic", "bayesian", "cbo", "fast_block_select")
"""The seven algorithms compared by the study (arXiv 2604.24938)."""

ALL_SEARCHES = tuple(name for name in SEARCHES if name != "exhaustive")
"""What ``--search all`` runs: every algorithm but ``exhaustive`` (infeasible beyond small N)."""

__all__ = [
    "ALL_SEARCHES",
    "OPTIONS",
    "PRIOR_GUIDED",
    "SEARCHES",
    "STUDY_SEARCHES",
    "ScreeningObjective",
    "SearchResult",
    "SubsetObjective",
    "TrackedObjective",
]
