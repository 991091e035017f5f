"""EvoPress's evolutionary depth-pruning search, as published (Sieberling et al., 2024).

It follows ``evo_drop_search.py`` of ``IST-DASLab/EvoPress`` with the settings of its
``scripts/run_drop_search.sh`` (whole blocks dropped, as ``--drop_entire_block`` does):

1. **Random initial population.** ``initial`` (64) distinct random removal sets of M blocks; one selection
   step on a random minibatch of ``initial_samples`` calibration samples keeps the ``population`` (1)
   fittest. No prior is involved.
2. **Offspring.** Each generation makes ``offspring`` (λ = 32) distinct children. A child copies a random
   parent and flips min(randint(1, 3), randint(1, 3)) times (``max_mutations`` = 3, biased towards few
   flips); a flip removes one kept block and restores one removed block (both drawn uniformly, the latter
   before the flip), so every child removes exactly M blocks. A child equal to a parent or to an earlier
   child is drawn again.
3. **Multi-step selection.** Step k ranks the candidates by their loss on a fresh random minibatch of
   ``samples_per_selection[k]`` calibration samples and keeps ``survivors_per_selection[k]``; the parents
   join the last step (elitist). Defaults: 2 survivors on 1 sample, then 1 on 16.
4. ``generations`` rounds; None (default) is the script's ⌊M·(E − M)/1.5⌋ (E blocks eligible, N unless some
   are protected). The result is the first of the final population, scored on the full calibration set.

**Units.** EvoPress counts calibration tokens: the script screens on 2,048 and re-scores on 32,768 of its
131,072 tokens. The study's calibration is 64 windows of 2,048 tokens, also 131,072 tokens, so 1 and 16
windows are exactly those two. Here a minibatch is whole samples (EvoPress cuts its last sequence to hit
the token count); a step asking for every sample, or more, uses the full (memoised) calibration loss.

**Fitness** (``screen`` option) — how a selection step scores its candidates:

* ``"samples"`` — EvoPress's own: the loss on the step's random minibatch, from an objective that
  implements :class:`~pruning.search.base.SampleScoringObjective` (``score_samples``), as the subset
  evaluator does (:meth:`~pruning.calibration.scoring.evaluator.SubsetEvaluator.score_samples_many`: only the
  batches holding the minibatch run, the step's candidates together through the trie);
* ``"objective"`` — an objective that implements :class:`~pruning.search.base.ScreeningObjective`
  (``screen_score``, a fixed cheap estimate) in every step but the last, the full loss in the last;
* ``"mixed"``, ``"prior"``, ``"random"`` — **approximations** for an objective that can do neither (this
  project's earlier screens): the steps before the last keep the children with the lowest additive
  single-block surrogate Σ_{i∈S} (s_i − s_min) (``prior``), drawn at random (``random``), or half each
  (``mixed``); the last step uses the full loss. They read the single-block prior, which EvoPress never does;
* ``"none"`` — the full calibration loss in every step (exact selection; up to λ full scores a generation).

``"auto"`` (default) picks ``samples``, else ``objective``, else ``none`` (exact selection: EvoPress's
steps with every sample; the approximations stay opt-in because EvoPress never reads a prior);
``options["screen"]`` records the one used, ``options["generations"]`` the number run, and
``options["minibatch_scores"]`` how many (set, sample) losses the minibatches cost.

Protected blocks (``--protect``) are never drawn: neither in the initial sets nor by a flip.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from tqdm.auto import tqdm

from ground.core.errors import UserError
from pruning.search import base

SCREENS = ("auto", "samples", "objective", "mixed", "prior", "random", "none")
DRAW_ATTEMPTS = 50
"""Draws per wanted set before giving up on finding that many distinct ones (tiny search spaces)."""


@dataclass
class Options(base.SearchOptions):
    """Settings of EvoPress (defaults: ``scripts/run_drop_search.sh``)."""

    population: int = base.integer(1)
    """Parents kept from one generation to the next (``--population_size``)."""
    offspring: int = base.integer(32)
    """λ, children per generation (``--offspring``)."""
    generations: int | None = base.integer(None, minimum=0, optional=True)
    """Generations; None = ⌊M·(E − M)/1.5⌋ (the script's rule, E the eligible blocks)."""
    initial: int = base.integer(64)
    """Random sets drawn for the initial selection (``--initially_generated``)."""
    initial_samples: int = base.integer(1)
    """Calibration samples of the initial selection's minibatch (``--initial_tokens`` 2048)."""
    survivors_per_selection: tuple[int, ...] = base.integers((2, 1))
    """Candidates kept by each selection step; the last equals ``population``."""
    samples_per_selection: tuple[int, ...] = base.integers((1, 16))
    """Calibration samples of each step's minibatch (``--tokens_per_selection`` 2048 32768)."""
    max_mutations: int = base.integer(3)
    """A child flips min(randint(1, k), randint(1, k)) blocks, k = this."""
    screen: str = base.one_of("auto", SCREENS)
    """How a step scores: auto, samples, objective, mixed, prior, random or none (module doc)."""

    def check(self):
        if len(self.survivors_per_selection) != len(self.samples_per_selection):
            raise ValueError("survivors_per_selection and samples_per_selection must have the same length")
        if self.survivors_per_selection[-1] != self.population:
            raise ValueError(
                f"the last selection step must keep population={self.population} candidates, "
                f"got survivors_per_selection={list(self.survivors_per_selection)}"
            )
        if self.initial < self.population:
            raise ValueError(f"initial must be at least population={self.population}, got {self.initial}")


def default_generations(budget: int, eligible: int) -> int:
    """The script's number of generations, ⌊M·(E − M)/1.5⌋ (at least 1)."""
    return max(1, int(budget * (eligible - budget) / 1.5))


def mutate(
    rng: np.random.Generator, parent: frozenset[int], eligible: list[int], max_mutations: int
) -> frozenset[int]:
    """EvoPress's mutation: min(randint(1, k), randint(1, k)) flips, each removing a kept block and
    restoring a removed one (drawn before the flip), so the child removes as many blocks as the parent."""
    removed = set(parent)
    flips = min(int(rng.integers(1, max_mutations + 1)), int(rng.integers(1, max_mutations + 1)))
    for _ in range(flips):
        kept = [block for block in eligible if block not in removed]
        if not kept:  # every eligible block is removed: nothing can come in
            break
        newly_removed = kept[int(rng.integers(len(kept)))]
        restored = sorted(removed)[int(rng.integers(len(removed)))]
        removed.add(newly_removed)
        removed.discard(restored)
    return base.as_key(removed)


def draw_distinct(draw: Callable[[], frozenset[int]], count: int, exclude=()) -> list[frozenset[int]]:
    """Up to ``count`` distinct sets from ``draw``, none in ``exclude`` (fewer when the space runs out)."""
    found: dict[frozenset[int], None] = {}
    excluded = set(exclude)
    for _ in range(count * DRAW_ATTEMPTS):
        if len(found) == count:
            break
        candidate = draw()
        if candidate not in excluded:
            found.setdefault(candidate)
    return list(found)


def choose_screen(objective: base.SubsetObjective, screen: str) -> str:
    """The screen ``auto`` stands for on this objective; a screen it cannot serve is a ValueError."""
    if screen == "auto":
        if isinstance(objective, base.SampleScoringObjective):
            return "samples"
        return "objective" if isinstance(objective, base.ScreeningObjective) else "none"
    if screen == "samples" and not isinstance(objective, base.SampleScoringObjective):
        raise ValueError("screen='samples' needs an objective with score_samples() and num_samples")
    if screen == "objective" and not isinstance(objective, base.ScreeningObjective):
        raise ValueError("screen='objective' needs an objective with screen_score()")
    return screen


class Selection:
    """EvoPress's selection steps on one objective, with the fitness ``screen`` asks for."""

    def __init__(self, objective: base.SubsetObjective, screen: str, rng: np.random.Generator):
        self.objective = objective
        self.screen = screen
        self.rng = rng
        self.minibatch_scores = 0
        """(set, sample) losses computed on minibatches."""
        if screen in ("mixed", "prior"):
            prior = np.asarray(objective.single_block_scores(), dtype=np.float64)
            self.increments = prior - prior.min()

    def fitness(self, candidates: list[frozenset[int]], samples: int, last: bool) -> dict:
        """Each candidate's loss for one step, all on the same fresh minibatch (``samples`` screen), on the
        objective's screen (``objective``, not in the last step) or on the full calibration set."""
        if self.screen == "samples" and samples < int(self.objective.num_samples):
            total = int(self.objective.num_samples)
            minibatch = sorted(int(index) for index in self.rng.choice(total, size=samples, replace=False))
            self.minibatch_scores += samples * len(candidates)
            score_group = getattr(self.objective, "score_samples_many", None)
            if score_group is not None:  # the subset evaluator runs the group through its trie at once
                return dict(zip(candidates, score_group(candidates, minibatch), strict=True))
            return {candidate: self.objective.score_samples(candidate, minibatch) for candidate in candidates}
        if self.screen == "objective" and not last:
            return {candidate: self.objective.screen_score(candidate) for candidate in candidates}
        return {candidate: self.objective.score(candidate) for candidate in candidates}

    def approximate(self, candidates: list[frozenset[int]], survivors: int) -> list:
        """A step of the approximate screens: by the additive surrogate, at random, or half each."""
        additive = {candidate: float(sum(self.increments[b] for b in candidate)) for candidate in candidates}
        by_surrogate = sorted(candidates, key=lambda candidate: (additive[candidate], sorted(candidate)))
        chosen = {"prior": survivors, "random": 0, "mixed": survivors // 2}[self.screen]
        kept = by_surrogate[:chosen]
        others = [candidate for candidate in candidates if candidate not in kept]
        drawn = [others[index] for index in self.rng.permutation(len(others))[: survivors - len(kept)]]
        return [(additive.get(candidate, math.nan), candidate) for candidate in kept + drawn]

    def step(self, candidates: list[frozenset[int]], survivors: int, samples: int, last: bool) -> list:
        """The ``survivors`` fittest candidates, fittest first, as ``(fitness, set)``."""
        if self.screen in ("mixed", "prior", "random") and not last:
            return self.approximate(candidates, survivors)
        fitness = self.fitness(candidates, samples, last)
        ranked = sorted(candidates, key=lambda candidate: (fitness[candidate], sorted(candidate)))
        return [(fitness[candidate], candidate) for candidate in ranked[:survivors]]


@base.define_search(Options, deterministic=False)
def search(
    objective: base.SubsetObjective, budget: int, settings: Options, seed: int, progress: bool
) -> base.SearchResult:
    """Run EvoPress: random initial population, swap mutations, multi-step selection.

    The objective may implement ``score_samples`` or ``screen_score``. The seed draws the initial sets,
    mutations and minibatches; the progress bar counts generations.

    Returns:
        The final population's first set, its full calibration loss, and per generation the leading parent
        and its fitness in the last selection step; ``options`` records the screen and generations used.
    """
    try:
        screen = choose_screen(objective, settings.screen)
    except ValueError as error:
        raise UserError(f"bad option for search 'evolution': {error}") from None
    rng = np.random.default_rng(seed)
    eligible = base.eligible_blocks(objective)
    selection = Selection(objective, screen, rng)
    space = math.comb(len(eligible), budget)

    def random_set() -> frozenset[int]:
        return base.as_key(rng.choice(eligible, size=budget, replace=False))

    starts = draw_distinct(random_set, min(settings.initial, space))
    if screen == "samples":
        initial_steps = [(settings.population, settings.initial_samples)]
    else:
        initial_steps = list(zip(settings.survivors_per_selection, settings.samples_per_selection))
    population = _select(selection, starts, initial_steps, [])
    generations = settings.generations
    if generations is None:
        generations = default_generations(budget, len(eligible))
    history = [{"generation": 0, "removed": sorted(population[0][1]), "fitness": population[0][0]}]
    steps = list(zip(settings.survivors_per_selection, settings.samples_per_selection))
    for generation in tqdm(range(1, generations + 1), desc="evolution", disable=not progress, leave=False):
        parents = [candidate for _, candidate in population]

        def child() -> frozenset[int]:
            parent = parents[int(rng.integers(len(parents)))]
            return mutate(rng, parent, eligible, settings.max_mutations)

        children = draw_distinct(child, settings.offspring, exclude=parents)
        population = _select(selection, children, steps, parents)
        history.append(
            {"generation": generation, "removed": sorted(population[0][1]), "fitness": population[0][0]}
        )
    result = base.finish(objective, population[0][1], history, settings)
    result.options.update(screen=screen, generations=generations, minibatch_scores=selection.minibatch_scores)
    return result


def _select(selection: Selection, candidates: list, steps: list[tuple[int, int]], parents: list) -> list:
    """Multi-step selection; the ``parents`` join the last step (elitist). Returns ``(fitness, set)``s."""
    for number, (survivors, samples) in enumerate(steps):
        last = number == len(steps) - 1
        if last:
            candidates = candidates + [parent for parent in parents if parent not in candidates]
        candidates_and_fitness = selection.step(candidates, survivors, samples, last)
        candidates = [candidate for _, candidate in candidates_and_fitness]
    return candidates_and_fitness
