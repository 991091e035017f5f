"""Running a ``prune`` run's searches on one shared objective, or each alone on a fresh one, and their cost.

:func:`run_searches` runs several searches on one objective (``--timing shared``), computing the single-block
prior once and charging it to each search that reads it; :func:`run_standalone` runs each on a fresh
objective (``--timing standalone``, the study's accounting of search cost). What every search of a run is
given (budget, names, seed, options, progress, protected blocks) is one :class:`SearchSettings`;
:func:`run_shared` and :func:`run_each_alone` take it as the pipeline does, and the two functions above are
the same with the settings spelled out, for a user's script.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pruning.search import PRIOR_GUIDED, SEARCHES, TrackedObjective
from pruning.search.base import ProtectedObjective, SearchResult, SubsetObjective

PRIOR_USERS = PRIOR_GUIDED | {"evolution"}
"""Searches that may ask for the single-block prior (evolution only with its opt-in approximate screens)."""

UNCHARGED_PRIOR = frozenset({"fast_block_select"})
"""Searches the standalone accounting gives the single-block prior for free, as the study's Table 4 does."""


@dataclass
class SearchRun:
    """One search's outcome on a (possibly shared) objective."""

    search: str
    """Search name."""
    result: SearchResult
    """What the search returned."""
    seconds: float
    """Wall time of the search (plus the shared prior's when it used it)."""
    subset_evaluations: int
    """Distinct removal sets the search asked for."""
    block_forwards: int | None
    """Evaluator block-forwards while it ran (plus the shared prior's when it used it); None without stats."""
    used_prior: bool
    """Whether it read the single-block prior."""
    head_positions: int | None = None
    """Positions the evaluator sent through the LM head while it ran (plus the shared prior's); None without
    stats."""
    stopped_early: int = 0
    """Candidates its ranking queries answered with a lower bound (scoring stopped early)."""
    prior_charged: bool = False
    """Whether ``seconds`` and ``block_forwards`` include the single-block prior's cost."""
    timing: str = "shared"
    """The accounting (:data:`~pruning.pipeline.config.TIMINGS`)."""


@dataclass(frozen=True)
class SearchSettings:
    """What every search of a run is given."""

    budget: int
    """M, the number of blocks each search removes."""
    searches: tuple[str, ...]
    """Names in ``SEARCHES``, run in this order."""
    seed: int = 0
    """Seed of every search."""
    options: Mapping[str, dict[str, Any]] = field(default_factory=dict)
    """Per search name, its options."""
    progress: bool = True
    """Show progress bars."""
    protected: frozenset[int] = frozenset()
    """Blocks no search may remove (each search sees a :class:`ProtectedObjective`)."""


OnRun = Callable[[SearchRun], None]
"""Called after each search (e.g. to save the memo and write the checkpoint)."""


def _counters(objective: SubsetObjective) -> tuple[int, int] | None:
    """``(block-forwards, LM-head positions)`` of an evaluator so far; None for an objective without stats."""
    stats = getattr(objective, "stats", None)
    if stats is None:
        return None
    return int(stats.block_forwards), int(stats.head_positions)


def _difference(after: tuple[int, int] | None, before: tuple[int, int] | None) -> list[int] | None:
    return [late - early for late, early in zip(after, before)] if before and after else None


def _needs_full_prior(objective: SubsetObjective, name: str, options: dict[str, Any]) -> bool:
    """Whether search ``name`` reads every single-block loss in full (one-shot needs only its M lowest
    when the objective answers ranking queries with its shortcuts)."""
    if name not in PRIOR_USERS or options.get("prior") == "random":
        return False
    if name == "evolution":  # only its approximate screens read the prior (EvoPress itself never does)
        return options.get("screen") in ("mixed", "prior")
    return not (name == "one_shot" and getattr(objective, "shortcuts", False))


def run_searches(
    objective: SubsetObjective,
    budget: int,
    searches: tuple[str, ...],
    *,
    seed: int = 0,
    options: dict[str, dict[str, Any]] | None = None,
    progress: bool = True,
    on_run: OnRun | None = None,
    protected: frozenset[int] = frozenset(),
    charge_prior: bool = True,
) -> list[SearchRun]:
    """Run several searches on one shared objective, computing the single-block prior once.

    Args:
        objective: the shared evaluator (or any SubsetObjective; ``stats`` is read when present).
        budget: M.
        searches: names in ``SEARCHES``, run in order.
        seed: seed of every search.
        options: per search name, its options.
        progress: show progress bars.
        on_run: called after each search (e.g. to save the memo and write the checkpoint).
        protected: blocks no search may remove (each search sees a :class:`ProtectedObjective`).
        charge_prior: add the prior's cost to the searches that read it.

    Returns:
        One :class:`SearchRun` per search.
    """
    settings = SearchSettings(budget, searches, seed, options or {}, progress, protected)
    return run_shared(objective, settings, on_run, charge_prior)


def run_shared(
    objective: SubsetObjective,
    settings: SearchSettings,
    on_run: OnRun | None = None,
    charge_prior: bool = True,
) -> list[SearchRun]:
    """:func:`run_searches` with its settings in one record."""
    options = settings.options
    prior_seconds, prior_counts = 0.0, [0, 0]
    if any(_needs_full_prior(objective, name, options.get(name, {})) for name in settings.searches):
        before, started = _counters(objective), time.perf_counter()
        objective.single_block_scores()
        prior_seconds = time.perf_counter() - started
        prior_counts = _difference(_counters(objective), before) or prior_counts
    runs = []
    for name in settings.searches:
        tracked = TrackedObjective(objective)
        # Outside the tracker, so that it counts only the sets actually scored.
        searched = ProtectedObjective(tracked, settings.protected) if settings.protected else tracked
        before, started = _counters(objective), time.perf_counter()
        result = SEARCHES[name](
            searched, settings.budget, seed=settings.seed, progress=settings.progress, **options.get(name, {})
        )
        seconds = time.perf_counter() - started
        counts = _difference(_counters(objective), before)
        if tracked.used_prior and charge_prior:
            seconds += prior_seconds
            counts = [count + prior for count, prior in zip(counts, prior_counts)] if counts else None
        run = SearchRun(
            search=name,
            result=result,
            seconds=seconds,
            subset_evaluations=tracked.subset_evaluations,
            block_forwards=counts[0] if counts else None,
            used_prior=tracked.used_prior,
            head_positions=counts[1] if counts else None,
            stopped_early=tracked.stopped_early,
            prior_charged=tracked.used_prior and charge_prior,
        )
        runs.append(run)
        if on_run is not None:
            on_run(run)
    return runs


def run_standalone(
    cold_objective: Callable[[], SubsetObjective],
    budget: int,
    searches: tuple[str, ...],
    *,
    seed: int = 0,
    options: dict[str, dict[str, Any]] | None = None,
    progress: bool = True,
    on_run: OnRun | None = None,
    protected: frozenset[int] = frozenset(),
) -> list[SearchRun]:
    """Run each search alone on a fresh objective: the study's accounting of search cost (Table 4).

    Every search pays for what it asks, the single-block prior included, except those in
    :data:`UNCHARGED_PRIOR`, which get the prior computed before their clock starts.

    Args:
        cold_objective: makes a fresh objective (a cold memo) per search.
        budget, searches, seed, options, progress, on_run, protected: as :func:`run_searches`.

    Returns:
        One :class:`SearchRun` per search, ``timing="standalone"``.
    """
    settings = SearchSettings(budget, searches, seed, options or {}, progress, protected)
    return run_each_alone(cold_objective, settings, on_run)


def run_each_alone(
    cold_objective: Callable[[], SubsetObjective], settings: SearchSettings, on_run: OnRun | None = None
) -> list[SearchRun]:
    """:func:`run_standalone` with its settings in one record."""
    runs = []
    for name in settings.searches:
        objective = cold_objective()
        charged = name not in UNCHARGED_PRIOR
        if not charged:
            objective.single_block_scores()  # before the clock: the study does not charge it
        alone = dataclasses.replace(settings, searches=(name,))
        (run,) = run_shared(objective, alone, charge_prior=charged)
        run.timing = "standalone"
        runs.append(run)
        if on_run is not None:
            on_run(run)
    return runs
