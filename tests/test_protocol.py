"""The study's protocol, pinned on hand-made cases (issue 15, fixes 6-10).

6. standalone search times: each search on a cold objective, fast_block_select not charged the prior;
7. the prior as the paper uses it: it seeds the GA's population and BO's surrogate, nothing more by default;
8. ``--protect``: protected blocks are never removed, by any search;
9. EvoPress as published: random initial population, min(randint(1,3), randint(1,3)) swap flips,
   multi-step selection on random minibatches;
10. CBO refuses the ``kl`` objective (its residual gradients vanish) instead of returning {0, 1, ...}.
"""

from __future__ import annotations

import itertools
import json
import random
from types import SimpleNamespace

import numpy as np
import pytest

from depthprune.testing.data import random_texts, write_jsonl
from depthprune.testing.objectives import ScreenedSyntheticObjective, SyntheticObjective
from ground.core.errors import UserError
from ground.core.objectives import OBJECTIVES
from pruning.search import SEARCHES
from pruning.search.base import (
    ProtectedObjective,
    SampleScoringObjective,
    prior_scores,
    resolve_protected,
)


def run(name: str, objective, budget: int, seed: int = 0, **options):
    return SEARCHES[name](objective, budget, seed=seed, progress=False, **options)


class CountingObjective(SyntheticObjective):
    """A memoised synthetic objective with the evaluator's ``stats``: a score of a set S not seen before costs
    N − |S| block-forwards (the kept blocks), a memo hit costs nothing."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.stats = SimpleNamespace(block_forwards=0, head_positions=0)
        self.memo: dict[frozenset[int], float] = {}

    def score(self, removed_blocks: frozenset[int]) -> float:
        removed = frozenset(removed_blocks)
        if removed not in self.memo:
            self.stats.block_forwards += self.num_blocks - len(removed)
            self.memo[removed] = super().score(removed)
        return self.memo[removed]


class SampledObjective(SyntheticObjective):
    """EvoPress's minibatches: sample s's loss is L(S) + z_s·g(S) with Σ_s z_s = 0, so the mean over all
    samples is L(S) and a minibatch sees L(S) plus noise that depends on the set and the minibatch."""

    def __init__(self, *args, num_samples: int = 64, spread: float = 0.2, **kwargs):
        super().__init__(*args, **kwargs)
        self.num_samples = num_samples
        offsets = np.random.default_rng(99).normal(0.0, 1.0, num_samples)
        self.offsets = offsets - offsets.mean()
        self.spread = spread
        self.minibatches: list[int] = []
        """Size of every minibatch a set was scored on."""

    def score_samples(self, removed_blocks: frozenset[int], samples: list[int]) -> float:
        assert len(set(samples)) == len(samples) and all(0 <= s < self.num_samples for s in samples)
        self.minibatches.append(len(samples))
        scale = np.random.default_rng(sorted(removed_blocks)).normal(0.0, self.spread)
        return self.loss(removed_blocks) + float(self.offsets[list(samples)].mean()) * scale


# ------------------------------------------------------------------------- 6. standalone search times


def test_standalone_runs_each_search_on_a_cold_objective():
    from pruning.pipeline.prune import run_searches, run_standalone

    made: list[CountingObjective] = []

    def cold() -> CountingObjective:
        made.append(CountingObjective(num_blocks=10, interaction=1.0))
        return made[-1]

    runs = run_standalone(cold, 3, ("one_shot", "greedy", "fast_block_select"), progress=False)
    assert len(made) == 3 and [run.timing for run in runs] == ["standalone"] * 3
    one_shot, greedy, fbs = runs
    # one-shot pays the prior (10 singles × 9 kept blocks) and its chosen set (7 kept blocks)
    assert one_shot.prior_charged and one_shot.block_forwards == 10 * 9 + 7
    # greedy pays its whole path, nothing memoised by one-shot: 10 singles, 9 pairs, 8 triples
    assert greedy.block_forwards == 10 * 9 + 9 * 8 + 8 * 7 and not greedy.prior_charged
    # FBS gets the prior for free (computed before its clock), as the study's Table 4 does
    assert fbs.used_prior and not fbs.prior_charged
    assert fbs.block_forwards == made[2].stats.block_forwards - 10 * 9 > 0

    shared = CountingObjective(num_blocks=10, interaction=1.0)
    one_shot_shared, greedy_shared = run_searches(shared, 3, ("one_shot", "greedy"), progress=False)
    assert one_shot_shared.timing == "shared" and one_shot_shared.block_forwards == 10 * 9 + 7
    # on the shared memo greedy's first step (the prior) is free: marginal cost only
    assert greedy_shared.block_forwards <= 9 * 8 + 8 * 7 < greedy.block_forwards
    assert greedy_shared.result.removed_blocks == greedy.result.removed_blocks


def test_timing_is_checked_and_recorded_in_the_study_summary(tiny_model_dirs, tmp_path):
    from pruning.calibration.config import CalibrationConfig
    from pruning.pipeline.prune import PruneConfig
    from pruning.study.plan import StudyConfig, plan_study, plan_summary

    calibration = CalibrationConfig("perplexity", "demo:text", samples=4, seq_len=32)
    with pytest.raises(UserError, match="--timing must be one of shared, standalone"):
        PruneConfig(model="m", calibration=calibration, drop=2, searches=("greedy",), timing="alone")
    model = str(tiny_model_dirs("llama"))
    with pytest.raises(UserError, match="--timing"):
        StudyConfig(model=model, drops=(2,), searches=("greedy", "beam"), timing="marginal")
    data = write_jsonl(tmp_path / "text.jsonl", random_texts(random.Random(0), rows=4, words=30))
    config = StudyConfig(
        model=model,
        drops=(2,),
        objectives=("perplexity",),
        searches=("greedy", "beam"),
        data=(f"text:{data}",),
        samples=2,  # of 4 documents: the other 2 are the held-out split prune checks for before loading
    )
    assert config.timing == "standalone"  # the study's own accounting by default
    plan = plan_study(config)
    assert {cell.timing for cell in plan.cells} == {"standalone"}
    summary = plan_summary(plan)
    assert summary["timing"] == "standalone" and summary["protect"] == []


@pytest.mark.slow
def test_prune_standalone_on_a_tiny_model_is_cold_and_recorded(tiny_model_dirs, tmp_path):
    from pruning.calibration.config import CalibrationConfig
    from pruning.calibration.scoring.build import build_evaluator
    from pruning.pipeline.prune import PruneConfig, prune, run_searches

    data = write_jsonl(tmp_path / "text.jsonl", random_texts(random.Random(1), rows=6, words=60))
    calibration = CalibrationConfig("perplexity", f"text:{data}", samples=4, seq_len=32)
    model = str(tiny_model_dirs("llama"))

    def config(timing: str) -> PruneConfig:
        return PruneConfig(
            model=model,
            calibration=calibration,
            drop=2,
            searches=("one_shot", "greedy", "fast_block_select"),
            out=tmp_path / "variants",
            progress=False,
            timing=timing,
        )

    prune(config("shared"))  # leaves a memo behind: a shared re-run would cost nothing
    standalone = {outcome.search: outcome for outcome in prune(config("standalone"))}
    # what each search costs on an evaluator of its own, measured here
    for name in ("greedy", "fast_block_select"):
        evaluator = build_evaluator(model, calibration, progress=False)
        if name == "fast_block_select":
            evaluator.single_block_scores()
        (alone,) = run_searches(
            evaluator, 2, (name,), progress=False, charge_prior=name != "fast_block_select"
        )
        assert standalone[name].block_forwards == alone.block_forwards > 0, name
        assert standalone[name].removed_blocks == list(alone.result.removed_blocks)
    for outcome in standalone.values():
        assert outcome.options["timing"] == "standalone"
    assert standalone["fast_block_select"].options["prior_charged"] is False
    assert standalone["one_shot"].options["prior_charged"] is True
    again = {outcome.search: outcome for outcome in prune(config("shared"))}
    assert again["greedy"].block_forwards == 0 and again["greedy"].options["timing"] == "shared"


# ------------------------------------------------------------------- 7. the prior, as the paper uses it


class PermutedPrior(SyntheticObjective):
    """The same losses, but a prior (single-block scores) from another objective."""

    def __init__(self, *args, prior_seed: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.fake_prior = SyntheticObjective(num_blocks=self.num_blocks, seed=prior_seed).costs + 2.0

    def single_block_scores(self) -> np.ndarray:
        self.prior_computations += 1
        return self.fake_prior.copy()


def test_bayesian_paper_use_touches_nothing_but_the_enqueued_trials():
    options = {"trials": 40, "prior_trials": 0}
    first = run("bayesian", PermutedPrior(interaction=1.0, seed=4, prior_seed=10), 4, **options)
    second = run("bayesian", PermutedPrior(interaction=1.0, seed=4, prior_seed=11), 4, **options)
    assert first.options["prior_use"] == "paper"
    assert [entry["removed"] for entry in first.history] == [entry["removed"] for entry in second.history]
    strong = {"trials": 40, "prior_trials": 0, "prior_use": "strong"}
    first = run("bayesian", PermutedPrior(interaction=1.0, seed=4, prior_seed=10), 4, **strong)
    second = run("bayesian", PermutedPrior(interaction=1.0, seed=4, prior_seed=11), 4, **strong)
    assert [entry["removed"] for entry in first.history] != [entry["removed"] for entry in second.history]


def test_bayesian_repair_ranks():
    from pruning.search.bayesian import decode, repair_ranks

    prior = np.array([0.0, 0.25, 0.5, 0.75, 1.0])
    assert repair_ranks(prior, "strong", 0) is prior
    paper = repair_ranks(prior, "paper", 0)
    assert np.array_equal(paper, repair_ranks(prior[::-1].copy(), "paper", 0))  # blind to the prior
    assert sorted(paper) == sorted(prior)
    # three yes-answers repaired to two by rank; one yes-answer completed by rank, among blocks 2, 5, 7, 8, 9
    ranks = np.array([0.5, 0.0, 1.0, 0.25, 0.75])
    assert decode(np.array([1, 1, 0, 1, 0]), ranks, 2, blocks=[2, 5, 7, 8, 9]) == {5, 8}
    assert decode(np.array([0, 0, 1, 0, 0]), ranks, 3, blocks=[2, 5, 7, 8, 9]) == {7, 5, 8}


def test_bayesian_counts_distinct_sets():
    objective = SyntheticObjective(interaction=1.0, seed=2)
    result = run("bayesian", objective, 4, trials=50)
    scored_sets = {removed for removed in objective.scored if len(removed) == 4}
    assert (
        result.options["distinct_sets"]
        == len(scored_sets)
        == len({tuple(e["removed"]) for e in result.history})
    )
    assert result.options["duplicate_trials"] == 50 - result.options["distinct_sets"] > 0


def test_genetic_paper_use_mutates_uniformly(monkeypatch):
    from pruning.search import genetic
    from pruning.search.base import removal_weights

    seen = []
    original = genetic._mutate

    def spy(rng, child, weights, rate):
        seen.append(weights.copy())
        return original(rng, child, weights, rate)

    monkeypatch.setattr(genetic, "_mutate", spy)
    objective = SyntheticObjective(interaction=1.0, seed=3)
    paper = run("genetic", objective, 4, generations=2)
    assert seen and all(np.allclose(weights, 0.1) for weights in seen)
    seen.clear()
    strong = run("genetic", SyntheticObjective(interaction=1.0, seed=3), 4, generations=2, prior_use="strong")
    expected = removal_weights(objective.single_block_scores(), 0.25)
    assert seen and all(np.allclose(weights, expected) for weights in seen)
    # the seeding is the prior's in both: the same initial population
    assert paper.history[0] == strong.history[0]
    with pytest.raises(UserError, match="prior_use"):
        run("genetic", objective, 4, prior_use="sometimes")


# -------------------------------------------------------------------------------- 8. protected blocks


def test_resolve_protected():
    assert resolve_protected(("first", "last"), 10) == {0, 9}
    assert resolve_protected(("Last", "3", "first"), 6) == {0, 3, 5}
    assert resolve_protected((), 6) == frozenset()
    for bad in (("middle",), ("6",), ("-1",)):
        with pytest.raises(UserError, match="--protect takes first, last or block indices 0..5"):
            resolve_protected(bad, 6)
    with pytest.raises(UserError, match="all 2 blocks"):
        resolve_protected(("first", "last"), 2)


def cheap_boundaries(seed: int) -> SyntheticObjective:
    """An objective whose first and last blocks are the cheapest, so protection must change the answer."""
    objective = SyntheticObjective(interaction=1.0, seed=seed)
    objective.costs[[0, 9]] = 0.01
    return objective


@pytest.mark.parametrize("name", sorted(SEARCHES))
def test_no_search_removes_a_protected_block(name):
    """Every search, on objectives whose unconstrained optimum removes blocks 0 and 9. The view raises if a
    search even asks for the score of a set that removes one, so asking counts as a failure too."""
    for seed in (0, 1):
        objective = ProtectedObjective(cheap_boundaries(seed), {0, 9})
        result = run(name, objective, 4, seed=seed, **({"trials": 30} if name == "bayesian" else {}))
        assert not {0, 9} & set(result.removed_blocks) and len(result.removed_blocks) == 4
        assert result.loss == pytest.approx(objective.objective.loss(result.removed_blocks))


def test_protected_exhaustive_is_the_constrained_optimum_and_budgets_shrink():
    plain = cheap_boundaries(2)
    unconstrained = min(itertools.combinations(range(10), 4), key=plain.loss)
    assert {0, 9} <= set(unconstrained)
    constrained = min(itertools.combinations(range(1, 9), 4), key=plain.loss)
    assert run("exhaustive", ProtectedObjective(plain, {0, 9}), 4).removed_blocks == constrained
    with pytest.raises(UserError, match=r"with blocks \[0, 9\] protected: choose M <= 8"):
        run("greedy", ProtectedObjective(SyntheticObjective(), {0, 9}), 9)
    with pytest.raises(ValueError, match="protected block"):
        ProtectedObjective(SyntheticObjective(), {0}).score(frozenset({0, 1}))


def test_random_prior_ranks_protected_blocks_last():
    plain = prior_scores(SyntheticObjective(), "random", 5)
    assert sorted(plain) == list(range(10))
    protected = prior_scores(ProtectedObjective(SyntheticObjective(), {0, 9}), "random", 5)
    assert sorted(protected[1:9]) == list(range(8)) and sorted(protected[[0, 9]]) == [8, 9]


def test_protect_reaches_the_plan_and_the_checkpoint_identity(tiny_model_dirs, tmp_path):
    from pruning.calibration.config import CalibrationConfig
    from pruning.pipeline.prune import PruneConfig, plan_prune

    calibration = CalibrationConfig("perplexity", "demo:text", samples=4, seq_len=32)

    def plan(**extra):
        return plan_prune(
            PruneConfig(
                model=str(tiny_model_dirs("llama")),
                calibration=calibration,
                drop=2,
                searches=("greedy", "bayesian"),
                out=tmp_path,
                **extra,
            )
        )

    plain, protected = plan(), plan(protect=("first", "last"))
    assert plain.protected == frozenset() and protected.protected == {0, 5}
    assert plain.checkpoint_dir("greedy") != protected.checkpoint_dir("greedy")
    assert protected.options["bayesian"]["study_name"].endswith("-paper-protect0.5")
    assert "storage" not in plan(timing="standalone").options["bayesian"]  # a cold study: in memory
    with pytest.raises(UserError, match=r"choose --drop <= 3"):
        plan_prune(
            PruneConfig(
                model=str(tiny_model_dirs("llama")),
                calibration=calibration,
                drop=4,
                searches=("greedy",),
                protect=("first", "last", "2"),
            )
        )


# ---------------------------------------------------------------------------------- 9. EvoPress


class ScriptedRng:
    """Returns scripted values from ``integers`` (EvoPress's randint calls), to follow a mutation by hand."""

    def __init__(self, values):
        self.values = list(values)

    def integers(self, low, high=None):
        value = self.values.pop(0)
        assert (0 if high is None else low) <= value < (low if high is None else high)
        return value


def test_evopress_mutation_by_hand():
    from pruning.search.evolution import mutate

    eligible = list(range(8))
    # flips = min(2, 3) = 2; flip 1: kept [3, 4, 5, 6, 7][1] = 4 in, removed [0, 1, 2][0] = 0 out;
    # flip 2: kept [0, 3, 5, 6, 7][4] = 7 in, removed [1, 2, 4][2] = 4 out (a flip may undo an earlier one)
    assert mutate(ScriptedRng([2, 3, 1, 0, 4, 2]), frozenset({0, 1, 2}), eligible, 3) == {1, 2, 7}
    # flips = min(3, 1) = 1, protected blocks (not eligible) never come in
    assert mutate(ScriptedRng([3, 1, 0, 2]), frozenset({1, 2, 5}), [1, 2, 4, 5, 6], 3) == {1, 2, 4}


def test_evopress_flip_count_distribution():
    """min(randint(1,3), randint(1,3)) is 1, 2, 3 with probability 5/9, 3/9, 1/9."""
    from pruning.search.evolution import mutate

    rng = np.random.default_rng(0)
    counts = np.zeros(4)
    parent, eligible = frozenset(range(200)), list(range(400))
    for _ in range(9000):
        # with 200 removed and 200 kept blocks a later flip undoes an earlier one about 1% of the time
        counts[len(mutate(rng, parent, eligible, 3) - parent)] += 1
    assert counts[0] < 5
    assert np.allclose(counts[1:] / counts.sum(), [5 / 9, 3 / 9, 1 / 9], atol=0.02)


def test_evopress_schedule_counts_by_hand():
    from pruning.search.evolution import default_generations

    assert default_generations(7, 32) == 116  # ⌊7·25/1.5⌋, the script's rule for 32 blocks
    assert default_generations(4, 10) == 16
    objective = SampledObjective(interaction=1.0, seed=0)
    assert isinstance(objective, SampleScoringObjective)
    result = run("evolution", objective, 4, seed=1)
    assert result.options["screen"] == "samples" and result.options["generations"] == 16
    # initial: 64 random sets on 1 sample; per generation 32 children on 1 sample, then 2 survivors and
    # the parent on 16 samples; the full loss only for the returned set
    assert objective.minibatches == [1] * 64 + ([1] * 32 + [16] * 3) * 16
    assert result.options["minibatch_scores"] == 64 + 16 * (32 + 3 * 16)
    assert list(objective.scored) == [frozenset(result.removed_blocks)]
    assert objective.prior_computations == 0  # a random initial population, no prior anywhere
    assert len(result.history) == 17


def test_evopress_screens_and_settings():
    assert run("evolution", SyntheticObjective(), 3, generations=2).options["screen"] == "none"
    assert run("evolution", ScreenedSyntheticObjective(), 3, generations=2).options["screen"] == "objective"
    plain = SyntheticObjective()
    run("evolution", plain, 3, generations=2)
    assert plain.prior_computations == 0
    with pytest.raises(UserError, match="score_samples"):
        run("evolution", SyntheticObjective(), 3, screen="samples")
    with pytest.raises(UserError, match="last selection step must keep population=1"):
        run("evolution", SyntheticObjective(), 3, survivors_per_selection=[2, 2])
    with pytest.raises(UserError, match="same length"):
        run("evolution", SyntheticObjective(), 3, survivors_per_selection=[4, 2, 1])
    # a tiny space: fewer distinct children than λ exist, and the search still ends
    tiny = run("evolution", SyntheticObjective(num_blocks=4), 3, generations=3)
    assert len(tiny.removed_blocks) == 3
    json.dumps(tiny.options)


# ----------------------------------------------------------------------------------- 10. CBO under kl


class KlLike(SyntheticObjective):
    """An objective that says it calibrates under kl (``CalibratedObjective``); asking it for gradients is a
    failure of the guard."""

    calibration_objective = OBJECTIVES["kl"]

    def residual_gradients(self) -> np.ndarray:
        raise AssertionError("CBO computed gradients it cannot use")


def test_cbo_refuses_kl_before_computing_gradients():
    with pytest.raises(UserError, match="cbo cannot run under the kl objective") as caught:
        run("cbo", KlLike(), 3)
    assert "\n" not in str(caught.value)


def test_cbo_refuses_all_zero_gradients():
    objective = SyntheticObjective()
    objective.gradients = np.zeros_like(objective.gradients)
    with pytest.raises(UserError, match="every residual gradient of the objective is zero"):
        run("cbo", objective, 3)


@pytest.mark.slow
def test_cbo_on_a_real_kl_evaluator_is_refused(tiny_model_dirs, tmp_path):
    from pruning.calibration.config import CalibrationConfig
    from pruning.calibration.scoring.build import build_evaluator
    from pruning.search import TrackedObjective

    data = write_jsonl(tmp_path / "text.jsonl", random_texts(random.Random(2), rows=4, words=40))
    evaluator = build_evaluator(
        str(tiny_model_dirs("llama")),
        CalibrationConfig("kl", f"text:{data}", samples=2, seq_len=16),
        progress=False,
    )
    with pytest.raises(UserError, match="kl"):
        run("cbo", ProtectedObjective(TrackedObjective(evaluator), {0}), 2)
