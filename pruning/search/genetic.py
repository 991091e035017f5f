"""Prior-guided genetic algorithm over removal sets of fixed size M (the study's GA).

Settings from the study: population 16, elitism 0.2, mutation rate 0.15, 10 generations. An individual
is a removal set of exactly M blocks; every operator preserves that cardinality.

How the prior guides it (``prior="single_block"``: the single-block ablation losses; ``prior="random"``:
a seeded random ranking, the control the study lacked):

* **Seeding** (always). Individual 0 of the first population is the one-shot solution (the M blocks
  with the lowest prior). The others are drawn without replacement with probabilities softmax(−rank/τ)
  over the prior ranks (τ = ``temperature``), so low-prior blocks are likely but every block is possible.
* **Mutation.** Each removed block is swapped out with probability ``mutation`` for a kept block. With
  ``prior_use="paper"`` (default) the replacement is drawn uniformly: the study's prior biases the initial
  population and nothing else, so the random-prior control differs from it in the seeding alone. With
  ``prior_use="strong"`` (this project's earlier behaviour) the replacement is drawn with the same
  prior-biased probabilities as the seeding, so the prior steers every generation.

Selection is a size-``tournament`` tournament on the calibration loss; crossover keeps the blocks both
parents remove and fills the rest from the blocks only one parent removes, uniformly at random. The
best ``round(elitism · population)`` individuals pass unchanged to the next generation. Children that
duplicate an individual already in the next population are re-drawn (a few tries), because the memo
makes duplicates free but useless. Generation 0 is the seeded population; ``generations`` rounds of
breeding follow, so at most population + generations · (population − elites) distinct sets are scored.

Protected blocks (``--protect``, :class:`~pruning.search.base.ProtectedObjective`) get zero probability in
the seeding and the mutation, and crossover only mixes its parents' blocks, so no individual removes one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tqdm.auto import tqdm

from pruning.search import base


@dataclass
class Options(base.SearchOptions):
    """Settings of the prior-guided genetic algorithm (defaults: the study's)."""

    population: int = base.integer(16, minimum=2)
    """Individuals per generation."""
    elitism: float = 0.2
    """Fraction of the population copied unchanged into the next generation (at least one)."""
    mutation: float = 0.15
    """Probability that each removed block of a child is swapped for a kept block."""
    generations: int = base.integer(10, minimum=0)
    """Rounds of breeding after the seeded initial population."""
    tournament: int = base.integer(2)
    """Tournament size of parent selection."""
    temperature: float = 0.25
    """Softness of the prior bias: weights ∝ exp(−rank/temperature), rank in [0, 1]."""
    prior: str = base.one_of("single_block", base.PRIOR_KINDS)
    """``single_block`` (the study's prior) or ``random`` (a seeded random ranking: the control)."""
    prior_use: str = base.one_of("paper", base.PRIOR_USES)
    """``paper``: the prior biases the initial population only; ``strong``: also every mutation."""

    def check(self):
        if not 0 <= self.elitism < 1:
            raise ValueError(f"elitism must be in [0, 1), got {self.elitism!r}")
        if not 0 <= self.mutation <= 1:
            raise ValueError(f"mutation must be in [0, 1], got {self.mutation!r}")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be positive, got {self.temperature!r}")


def _sample_set(rng: np.random.Generator, weights: np.ndarray, budget: int) -> frozenset[int]:
    return base.as_key(rng.choice(len(weights), size=budget, replace=False, p=weights))


def _crossover(rng: np.random.Generator, first: frozenset[int], second: frozenset[int], budget: int):
    common = sorted(first & second)
    either = sorted(first ^ second)
    fill = rng.choice(either, size=budget - len(common), replace=False) if either else []
    return base.as_key([*common, *fill])


def _mutate(rng: np.random.Generator, child: frozenset[int], weights: np.ndarray, rate: float):
    """Swap each removed block, with probability ``rate``, for a kept block drawn by ``weights``."""
    removed = set(child)
    for block in sorted(child):
        if rng.random() >= rate:
            continue
        kept = np.array(
            [other for other in range(len(weights)) if other not in removed and weights[other] > 0]
        )
        if not len(kept):  # every eligible block is removed: nothing to swap in
            continue
        probabilities = weights[kept] / weights[kept].sum()
        replacement = int(rng.choice(kept, p=probabilities))
        removed.discard(block)
        removed.add(replacement)
    return base.as_key(removed)


def eligible_weights(objective: base.SubsetObjective, weights: np.ndarray) -> np.ndarray:
    """``weights`` with the protected blocks at zero, renormalised (unchanged when none is protected)."""
    eligible = base.eligible_blocks(objective)
    if len(eligible) == len(weights):
        return weights
    masked = np.zeros_like(weights)
    masked[eligible] = weights[eligible]
    return masked / masked.sum()


@base.define_search(Options, deterministic=False)
def search(
    objective: base.SubsetObjective, budget: int, settings: Options, seed: int, progress: bool
) -> base.SearchResult:
    """Evolve a population of size-M removal sets, seeded under the prior (and, ``strong``, mutated under it).

    The seed draws every random choice; the progress bar counts generations.

    Returns:
        The best removal set ever scored, its loss, and per generation the best and mean loss.
    """
    rng = np.random.default_rng(seed)
    scores = base.prior_scores(objective, settings.prior, seed)
    weights = eligible_weights(objective, base.removal_weights(scores, settings.temperature))
    uniform = eligible_weights(objective, np.full(objective.num_blocks, 1 / objective.num_blocks))
    mutation_weights = weights if settings.prior_use == "strong" else uniform
    ranked = np.where(weights > 0, scores, np.inf)  # the one-shot set among the eligible blocks
    # No more distinct individuals exist than C(N, M); stop re-drawing duplicates after a few tries.
    population = [base.as_key(base.lowest(ranked, budget))]
    for _ in range(settings.population * 20):
        if len(population) == settings.population:
            break
        candidate = _sample_set(rng, weights, budget)
        if candidate not in population:
            population.append(candidate)
    while len(population) < settings.population:
        population.append(_sample_set(rng, uniform, budget))

    elites = max(1, round(settings.elitism * settings.population))
    history: list[dict] = []
    best: tuple[float, list[int]] | None = None
    generations = range(settings.generations + 1)
    for generation in tqdm(generations, desc="genetic", disable=not progress, leave=False):
        losses = [objective.score(individual) for individual in population]
        order = sorted(range(len(population)), key=lambda index: (losses[index], sorted(population[index])))
        leader = (losses[order[0]], sorted(population[order[0]]))
        best = leader if best is None or leader < best else best
        history.append(
            {
                "generation": generation,
                "best_loss": best[0],
                "best_removed": best[1],
                "mean_loss": float(np.mean(losses)),
            }
        )
        if generation == settings.generations:
            break
        next_population = [population[index] for index in order[:elites]]

        def pick_parent() -> frozenset[int]:
            contenders = rng.choice(len(population), size=settings.tournament, replace=True)
            return population[min(contenders, key=lambda index: (losses[index], int(index)))]

        while len(next_population) < settings.population:
            for _ in range(10):
                child = _crossover(rng, pick_parent(), pick_parent(), budget)
                child = _mutate(rng, child, mutation_weights, settings.mutation)
                if child not in next_population:
                    break
            next_population.append(child)
        population = next_population
    return base.finish(objective, best[1], history, settings)
