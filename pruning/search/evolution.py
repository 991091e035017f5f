"""EvoPress's (1+λ) evolutionary search with multi-step selection (Sieberling et al., 2024).

One parent; each generation makes λ = ``offspring`` (32) children by swap mutations, each swapping
``k`` removed blocks for ``k`` kept ones (k ~ Geometric(1/2), capped), so every child removes exactly M
blocks. Selection runs in two steps, as EvoPress does with few tokens then many:

1. **Screen** all children cheaply and keep the ``survivors`` best;
2. **Score** the survivors with the full calibration loss; the best replaces the parent if it is no
   worse (elitist: the parent competes in the final step).

The screen depends on what the objective offers (``screen`` option):

* ``"objective"`` — the objective implements :class:`~pruning.search.base.ScreeningObjective`
  (``screen_score``: the loss on a small fraction of the calibration data), EvoPress's own method;
* ``"mixed"`` — the **approximation** used otherwise (the default evaluator offers no screening): half of
  the survivors are the children with the lowest additive single-block surrogate Σ_{i∈S} (s_i − s_min),
  free once the shared prior exists; the other half are drawn uniformly from the remaining children,
  because the additive surrogate is blind to interactions between removed blocks and, used alone, keeps
  the search next to the one-shot set (on the synthetic objectives of the tests: optimal in 9 of 12 cases
  with ``"prior"`` alone, 10 of 12 with ``"mixed"`` or ``"random"``, 12 of 12 with ``"none"``);
* ``"prior"`` / ``"random"`` — only the surrogate / only the uniform draw;
* ``"none"`` — no screening: every child gets the full score (exact selection, up to λ evaluations per
  generation, about 5× the evaluations of the screened variants).

``"auto"`` (default) picks ``"objective"`` when available, else ``"mixed"``. The first parent is the best
of ``initial`` random sets (screened, then the survivors fully scored), since EvoPress starts from a
random feasible point rather than from a prior.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tqdm.auto import tqdm

from pruning.search.base import (
    ScreeningObjective,
    SearchResult,
    SubsetObjective,
    as_key,
    check_budget,
    finish,
    parse_options,
)

SCREENS = ("auto", "objective", "prior", "random", "mixed", "none")


@dataclass
class Options:
    """Settings of the (1+λ) evolutionary search (defaults: EvoPress's offspring count)."""

    offspring: int = 32
    """λ, children per generation."""
    generations: int = 50
    """Generations after the initial parent is chosen."""
    survivors: int = 4
    """Children that pass the screen and get the full calibration score."""
    initial: int = 16
    """Random sets screened to choose the first parent."""
    screen: str = "auto"
    """``auto``, ``objective`` (screen_score), ``mixed``, ``prior``, ``random`` or ``none`` (module doc)."""

    def __post_init__(self):
        for name in ("offspring", "survivors", "initial"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not isinstance(self.generations, int) or self.generations < 0:
            raise ValueError(f"generations must be a non-negative integer, got {self.generations!r}")
        if self.screen not in SCREENS:
            raise ValueError(f"screen must be one of {', '.join(SCREENS)}, got {self.screen!r}")


def mutate(rng: np.random.Generator, parent: frozenset[int], num_blocks: int) -> frozenset[int]:
    """Swap k removed blocks for k kept blocks, k ~ Geometric(1/2) capped at min(M, N − M)."""
    removed = sorted(parent)
    kept = [block for block in range(num_blocks) if block not in parent]
    swaps = min(int(rng.geometric(0.5)), len(removed), len(kept))
    leaving = rng.choice(removed, size=swaps, replace=False)
    arriving = rng.choice(kept, size=swaps, replace=False)
    return as_key((set(removed) - set(leaving.tolist())) | set(arriving.tolist()))


def search(
    objective: SubsetObjective, budget: int, *, seed: int = 0, progress: bool = True, **options
) -> SearchResult:
    """Run (1+λ) evolution with screen-then-score selection.

    Args:
        objective: scores removal sets (lower is better); may implement ``screen_score``.
        budget: M, the number of blocks to remove.
        seed: seeds initialisation and mutations.
        progress: show a progress bar over generations.
        **options: see :class:`Options`.

    Returns:
        The final parent (the best set fully scored), its loss, and per generation the parent's loss;
        ``options["screen"]`` records the screen actually used.
    """
    settings = parse_options(Options, options, "evolution")
    check_budget(objective, budget)
    num_blocks = objective.num_blocks
    rng = np.random.default_rng(seed)
    screen = settings.screen
    if screen == "auto":
        screen = "objective" if isinstance(objective, ScreeningObjective) else "mixed"
    if screen == "objective" and not isinstance(objective, ScreeningObjective):
        raise ValueError("screen='objective' needs an objective with screen_score()")
    if screen in ("prior", "mixed"):
        prior = np.asarray(objective.single_block_scores(), dtype=np.float64)
        increments = prior - prior.min()

    def screened(candidates: list[frozenset[int]]) -> list[frozenset[int]]:
        unique = list(dict.fromkeys(candidates))
        if screen == "none":
            return unique
        if screen == "objective":
            cheap = {candidate: objective.screen_score(candidate) for candidate in unique}
        elif screen == "random":
            cheap = {candidate: float(rng.random()) for candidate in unique}
        elif screen == "mixed":
            half = settings.survivors // 2
            additive = {
                candidate: float(sum(increments[block] for block in candidate)) for candidate in unique
            }
            chosen = sorted(unique, key=lambda candidate: (additive[candidate], sorted(candidate)))[:half]
            others = [candidate for candidate in unique if candidate not in chosen]
            drawn = rng.permutation(len(others))[: settings.survivors - half]
            return chosen + [others[index] for index in drawn]
        else:
            cheap = {candidate: float(sum(increments[block] for block in candidate)) for candidate in unique}
        ranked = sorted(unique, key=lambda candidate: (cheap[candidate], sorted(candidate)))
        return ranked[: settings.survivors]

    def best_of(candidates: list[frozenset[int]]) -> tuple[float, frozenset[int]]:
        return min(
            ((objective.score(candidate), candidate) for candidate in candidates),
            key=lambda item: (item[0], sorted(item[1])),
        )

    starts = [as_key(rng.choice(num_blocks, size=budget, replace=False)) for _ in range(settings.initial)]
    parent_loss, parent = best_of(screened(starts))
    history = [{"generation": 0, "removed": sorted(parent), "loss": parent_loss}]
    for generation in tqdm(
        range(1, settings.generations + 1), desc="evolution", disable=not progress, leave=False
    ):
        children = [mutate(rng, parent, num_blocks) for _ in range(settings.offspring)]
        survivors = [child for child in screened(children) if child != parent]
        if survivors:
            child_loss, child = best_of(survivors)
            if child_loss <= parent_loss:
                parent_loss, parent = child_loss, child
        history.append({"generation": generation, "removed": sorted(parent), "loss": parent_loss})
    result = finish(objective, parent, history, settings)
    result.options["screen"] = screen
    return result
