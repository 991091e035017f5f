"""Beam search over removal sets (width 5 in the study).

Like greedy elimination, but keeps the ``width`` best partial removal sets at every step: each is
extended by every block it does not contain yet, duplicates (the same set reached in another order) are
merged, and the ``width`` lowest-loss sets survive. Width 1 is exactly greedy. Cost: at most
width · (N − step) evaluations per step; the first step is the single-block prior. Deterministic.

A step needs only the ``width`` lowest, so it is a ranking query (:func:`~pruning.search.base.rank_lowest`,
the beam as the bases): candidates run from their new block on, and one whose loss is bound to exceed the
``width``-th best may stop early (counted as ``stopped`` in the step's history).
"""

from __future__ import annotations

from dataclasses import dataclass

from tqdm.auto import tqdm

from pruning.search import base


@dataclass
class Options(base.SearchOptions):
    """Settings of beam search."""

    width: int = base.integer(5)
    """Partial removal sets kept per step (the study's B = 5); width 1 is greedy elimination. A budget
    in subset evaluations (``evaluations=E``, :mod:`pruning.search.budgets`) sets it to E / greedy's cost."""


@base.define_search(Options, deterministic=True)
def search(
    objective: base.SubsetObjective, budget: int, settings: Options, seed: int, progress: bool
) -> base.SearchResult:
    """Grow removal sets one block at a time, keeping the ``width`` best at each step.

    The seed is unused (deterministic); the progress bar counts steps.

    Returns:
        The best removal set of size M, its loss, and the beam after every step.
    """
    num_blocks = objective.num_blocks
    beam: list[frozenset[int]] = [frozenset()]
    history: list[dict] = []
    for step in tqdm(range(budget), desc="beam", disable=not progress, leave=False):
        extended = {
            base.as_key([*state, block])
            for state in beam
            for block in range(num_blocks)
            if block not in state
        }
        candidates = sorted(extended, key=sorted)
        answers = base.rank_lowest(objective, candidates, keep=settings.width, bases=beam)
        losses = {candidate: answer.loss for candidate, answer in zip(candidates, answers) if answer.exact}
        # Sort by loss, ties by the sorted block list, so the beam is independent of set ordering.
        ranked = sorted(losses, key=lambda candidate: (losses[candidate], sorted(candidate)))
        beam = ranked[: settings.width]
        entry = {
            "step": step,
            "evaluated": len(candidates),
            "beam": [{"removed": sorted(state), "loss": losses[state]} for state in beam],
        }
        if len(losses) < len(candidates):
            entry["stopped"] = len(candidates) - len(losses)
        history.append(entry)
    return base.finish(objective, beam[0], history, settings)
