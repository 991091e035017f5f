"""One contract, every search (optuna ``testing/pytest_samplers.py`` style).

Each algorithm in ``SEARCHES`` returns exactly M distinct valid blocks, is deterministic under a seed,
rejects bad budgets and unknown options, and on small synthetic objectives where ``exhaustive`` knows
the optimum lands within its documented gap. The synthetic objective
(:mod:`depthprune.testing.objectives`) is additive per-block costs plus pairwise interactions (strongest
between neighbours, as in real models), with residual gradients and Block Influence consistent with the
additive part, so CBO's surrogate and ShortGPT's criterion are meaningful on it, and a block-input similarity
matrix (an arc turned by the blocks' costs) for LoRP's and LLM-Streamline's.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from depthprune.testing.objectives import (
    ScreenedSyntheticObjective,
    SyntheticObjective,
)
from ground.core.errors import UserError
from pruning.search import (
    ALL_SEARCHES,
    DETERMINISTIC,
    OPTIONS,
    PRIOR_GUIDED,
    SEARCHES,
    STUDY_SEARCHES,
    TrackedObjective,
    uses_seed,
)
from pruning.search.base import SearchResult, SubsetObjective

# Keep the slowest search quick in tests; everything else runs at the study's settings.
FAST_OPTIONS = {"bayesian": {"trials": 60}}


def run(
    name: str, objective, budget: int, seed: int = 0, study_settings: bool = False, **options
) -> SearchResult:
    """Run search ``name`` quietly; ``study_settings=False`` shortens the slow ones (FAST_OPTIONS)."""
    defaults = {} if study_settings else FAST_OPTIONS.get(name, {})
    return SEARCHES[name](objective, budget, seed=seed, progress=False, **{**defaults, **options})


def optimum_and_median(objective: SyntheticObjective, budget: int) -> tuple[float, float]:
    subsets = itertools.combinations(range(objective.num_blocks), budget)
    losses = [objective.loss(subset) for subset in subsets]
    return min(losses), float(np.median(losses))


def relative_gap(loss: float, optimum: float, median: float) -> float:
    """0 at the optimum, 1 at the median removal set."""
    return (loss - optimum) / (median - optimum)


# Documented worst relative gap on the interacting objectives at the study's settings (0 = optimal, 1 = a
# median random set); measured maxima over 12 objective seeds were: beam 0, genetic 0.21 (0.08 with
# prior_use="strong"), bayesian 0.23 (0.08 strong), evolution 0.18 (EvoPress's schedule, exact selection),
# greedy 0.31, cbo 0.30, fast_block_select 0.37, one_shot and block_influence 0.69, streamline 0.84, lorp
# 1.86. The exact-or-near searches must be (near-)optimal; the one-shot criteria and CBO's additive surrogate
# cannot see interactions, so they only have to beat a typical random set. LoRP and LLM-Streamline choose by
# the shape of the similarity matrix, not by any block's cost: LLM-Streamline takes the cheapest *contiguous*
# run; LoRP spreads its picks over clusters and keeps blocks 0 and N-1, which on these objectives is often
# worse than a median random set.
DOCUMENTED_GAP = {
    "exhaustive": 0.0,
    "greedy": 0.35,  # SLEB can be trapped by an early choice when neighbours interact
    "beam": 0.05,
    "genetic": 0.25,  # the prior seeds the population only (the paper's use); "strong" stays within 0.1
    "bayesian": 0.25,  # the prior seeds the surrogate only (the paper's use); "strong" stays within 0.1
    "evolution": 0.25,  # without minibatch or objective screening it selects on the full loss
    "fast_block_select": 0.35,
    "cbo": 0.35,
    "one_shot": 0.75,
    "block_influence": 0.75,
    "streamline": 0.9,
    "lorp": 1.9,
}

SIMILARITY_STRUCTURE = {"lorp", "streamline"}
"""Searches that cannot find even an additive optimum (they are held to their documented gap there too)."""

MAX_BUDGET = {"lorp": 8, "streamline": 8}
"""Largest M at N = 10 where it is not 9: both keep blocks 0 and N-1, as published."""


def test_registry_of_searches_is_complete():
    assert set(SEARCHES) == set(OPTIONS) == set(DOCUMENTED_GAP)
    for name, function in SEARCHES.items():
        assert function.__module__ == f"pruning.search.{name}"  # key equals file name
    assert set(STUDY_SEARCHES) <= set(ALL_SEARCHES) and "exhaustive" not in ALL_SEARCHES
    assert PRIOR_GUIDED == {"one_shot", "genetic", "bayesian", "fast_block_select"}
    # the searches whose seed draws something (checked against each module's use of it)
    assert set(SEARCHES) - DETERMINISTIC == {"genetic", "bayesian", "cbo", "lorp", "evolution"}
    assert isinstance(SyntheticObjective(), SubsetObjective)


@pytest.mark.parametrize("name", sorted(SEARCHES))
class TestSearchContract:
    """Every search satisfies these."""

    @pytest.mark.parametrize("budget", [1, 3, 9])
    def test_returns_exactly_budget_distinct_valid_blocks(self, name, budget):
        objective = SyntheticObjective(interaction=1.0, seed=1)
        if budget > MAX_BUDGET.get(name, budget):
            with pytest.raises(UserError, match=f"choose M <= {MAX_BUDGET[name]}"):
                run(name, objective, budget)
            return
        result = run(name, objective, budget)
        assert isinstance(result, SearchResult)
        assert len(result.removed_blocks) == budget == len(set(result.removed_blocks))
        assert all(isinstance(block, int) for block in result.removed_blocks)
        assert all(0 <= block < objective.num_blocks for block in result.removed_blocks)
        assert list(result.removed_blocks) == sorted(result.removed_blocks)
        assert result.loss == pytest.approx(objective.loss(result.removed_blocks))
        assert isinstance(result.options, dict) and isinstance(result.history, list) and result.history

    def test_deterministic_for_a_seed(self, name):
        first = run(name, SyntheticObjective(interaction=1.0, seed=2), 4, seed=7)
        second = run(name, SyntheticObjective(interaction=1.0, seed=2), 4, seed=7)
        assert first.removed_blocks == second.removed_blocks
        assert first.loss == second.loss
        assert first.history == second.history

    def test_a_deterministic_search_ignores_the_seed(self, name):
        """What ``DETERMINISTIC`` promises (a study reuses such a cell across seeds): the same mask under
        another seed with the single-block prior; under the random prior the seed matters (``uses_seed``)."""
        if name not in DETERMINISTIC:
            assert uses_seed(name)
            return
        assert not uses_seed(name) and uses_seed(name, random_prior=True) == (name in PRIOR_GUIDED)
        first = run(name, SyntheticObjective(interaction=1.0, seed=2), 4, seed=0)
        second = run(name, SyntheticObjective(interaction=1.0, seed=2), 4, seed=5)
        assert (first.removed_blocks, first.loss) == (second.removed_blocks, second.loss)

    @pytest.mark.parametrize("budget", [0, 10, 11, -1])
    def test_rejects_impossible_budget(self, name, budget):
        with pytest.raises(UserError, match="remove"):
            run(name, SyntheticObjective(), budget)

    def test_rejects_unknown_option(self, name):
        with pytest.raises(UserError, match="unknown option"):
            run(name, SyntheticObjective(), 3, no_such_option=1)

    def test_optimal_on_additive_objective(self, name):
        """Without interactions every search here finds the optimum (one-shot included), but for the two that
        choose by similarity structure alone."""
        objective = SyntheticObjective(interaction=0.0, seed=3)
        optimum, median = optimum_and_median(objective, 4)
        loss = run(name, objective, 4).loss
        if name in SIMILARITY_STRUCTURE:
            assert relative_gap(loss, optimum, median) <= DOCUMENTED_GAP[name]
        else:
            assert loss == pytest.approx(optimum)

    @pytest.mark.parametrize("seed", [0, 1, 2])
    def test_within_documented_gap_of_exhaustive(self, name, seed):
        objective = SyntheticObjective(interaction=1.0, seed=seed)
        optimum, median = optimum_and_median(objective, 4)
        exact = run("exhaustive", SyntheticObjective(interaction=1.0, seed=seed), 4)
        assert exact.loss == pytest.approx(optimum)
        result = run(name, objective, 4, seed=seed, study_settings=True)
        assert relative_gap(result.loss, optimum, median) <= DOCUMENTED_GAP[name] + 1e-9

    def test_options_are_recorded_and_json_safe(self, name):
        import json

        result = run(name, SyntheticObjective(), 3)
        json.dumps(result.options)
        json.dumps(result.history)
        for field_name in OPTIONS[name].__dataclass_fields__:
            assert field_name in result.options


@pytest.mark.parametrize("name", sorted(PRIOR_GUIDED))
def test_random_prior_is_a_seeded_control(name):
    """prior="random" ignores the single-block prior's information and depends on the seed."""
    chosen = set()
    for seed in range(4):
        first = run(name, SyntheticObjective(interaction=1.0, seed=5), 4, seed=seed, prior="random")
        again = run(name, SyntheticObjective(interaction=1.0, seed=5), 4, seed=seed, prior="random")
        assert first.removed_blocks == again.removed_blocks
        assert first.options["prior"] == "random"
        chosen.add(first.removed_blocks)
    if name == "one_shot":  # nothing but the prior decides one-shot
        assert len(chosen) > 1


def test_one_shot_random_prior_costs_no_evaluation_of_singles():
    objective = SyntheticObjective()
    run("one_shot", objective, 3, prior="random")
    assert objective.prior_computations == 0 and len(objective.scored) == 1


def test_greedy_costs_the_sleb_number_of_evaluations():
    objective = SyntheticObjective(interaction=1.0)
    run("greedy", objective, 4)
    assert len(objective.scored) == 10 + 9 + 8 + 7


def test_exhaustive_refuses_large_spaces():
    with pytest.raises(UserError, match="max_subsets"):
        run("exhaustive", SyntheticObjective(num_blocks=32), 7)


def test_cbo_exact_enumeration_matches_brute_force_and_flags_fallback():
    from pruning.search.cbo import energy_matrix, enumerate_lowest, state_energies

    rng = np.random.default_rng(0)
    hessian = energy_matrix(rng.normal(size=(12, 11)))
    for budget in (1, 2, 3, 5, 10):
        states = np.array(list(itertools.combinations(range(11), budget)))
        energies = state_energies(hessian, states)
        expected = sorted(
            (round(float(energy), 9), tuple(int(block) for block in state))
            for energy, state in zip(energies, states)
        )[:6]
        found = [(round(e, 9), s) for e, s in enumerate_lowest(hessian, budget, 6)]
        assert found == expected
    objective = SyntheticObjective(num_blocks=20, interaction=1.0)
    exact = run("cbo", objective, 5)
    assert exact.options["exact"] is True and exact.options["solver"] == "enumeration"
    fallback = run("cbo", objective, 5, max_states=math.comb(20, 5) - 1)
    assert fallback.options["exact"] is False and fallback.options["solver"] == "local_search"
    assert len(fallback.removed_blocks) == 5


def test_evolution_uses_objective_screening_when_offered():
    plain = run("evolution", SyntheticObjective(interaction=1.0), 4)
    screened = run("evolution", ScreenedSyntheticObjective(interaction=1.0), 4)
    assert plain.options["screen"] == "none" and screened.options["screen"] == "objective"
    with pytest.raises(UserError, match="screen"):
        run("evolution", SyntheticObjective(), 4, screen="sometimes")


def test_bayesian_resumes_from_storage(tmp_path):
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    first_objective = SyntheticObjective(interaction=1.0)
    partial = run("bayesian", first_objective, 4, trials=8, storage=storage, study_name="resume")
    assert len(partial.history) == 8
    resumed_objective = SyntheticObjective(interaction=1.0)
    resumed = run("bayesian", resumed_objective, 4, trials=12, storage=storage, study_name="resume")
    # The first 8 trials come back from storage: only the 4 new ones (plus the prior) ask the objective.
    assert len(resumed.history) == 12
    assert [entry["trial"] for entry in resumed.history[:8]] == [entry["trial"] for entry in partial.history]
    assert sum(resumed_objective.scored.values()) <= 4 + 1 + 10  # new trials, final score, prior
    assert resumed.loss <= partial.loss
    assert resumed.options["storage"] == storage and resumed.options["study_name"] == "resume"


def test_tracked_objective_counts_what_one_search_asked():
    objective = SyntheticObjective(interaction=1.0)
    tracked = TrackedObjective(objective)
    run("one_shot", tracked, 3)
    assert tracked.used_prior and tracked.subset_evaluations == 10 + 1
    shared = TrackedObjective(objective)
    run("genetic", shared, 3)
    assert objective.prior_computations == 1  # the prior was shared, not recomputed
    assert shared.used_prior and shared.subset_evaluations >= 16


@pytest.mark.parametrize("name", ["genetic", "bayesian"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_strong_prior_use_keeps_the_earlier_gap(name, seed):
    """prior_use="strong" (the prior also steers mutations / repairs trials) stays as close to the optimum
    as before the paper's weaker use became the default."""
    objective = SyntheticObjective(interaction=1.0, seed=seed)
    optimum, median = optimum_and_median(objective, 4)
    result = run(name, objective, 4, seed=seed, study_settings=True, prior_use="strong")
    assert result.options["prior_use"] == "strong"
    assert relative_gap(result.loss, optimum, median) <= 0.1 + 1e-9
