"""The evaluator's exact shortcuts change the cost of a search, never its answer.

On the tiny demo model (trained, so removals differ in loss) and a tiny random llama: every search of the
panel, under every objective and several seeds, selects the same blocks and reports the same loss with the
shortcuts as without them; a candidate stopped at a lower bound never becomes a memo value until it is
scored to the end; the trie scheduler's scores equal one-by-one scoring; ranking queries return exactly
the k lowest.
"""

from __future__ import annotations

import itertools
import json
import random

import numpy as np
import pytest

from pruning.calibration.config import CalibrationConfig
from pruning.calibration.scoring.build import build_evaluator
from pruning.calibration.scoring.shortcuts import branch_points, shared_depth, spaced, trie_order
from pruning.search import SEARCHES, STUDY_SEARCHES, TrackedObjective
from pruning.search.base import rank_lowest

BUDGET = 3
FAST_OPTIONS = {"bayesian": {"trials": 12}, "genetic": {"generations": 2}}
OBJECTIVES = ("perplexity", "kl", "task_margin")


def demo_config(demo_dir, objective: str, seed: int = 0, samples: int = 8) -> CalibrationConfig:
    data = "demo:qa" if objective == "task_margin" else "demo:text"
    # Questions get room for their longest item (up to 35 tokens under seeds 0-2): no silent truncation.
    seq_len = 64 if objective == "task_margin" else 32
    return CalibrationConfig(objective, f"{data}@{demo_dir}", samples=samples, seq_len=seq_len, seed=seed)


def evaluator(demo_dir, objective: str, seed: int = 0, **options):
    """4 batches of 2 sequences (or 2 items), so that a ranking can stop a candidate between batches."""
    return build_evaluator(
        str(demo_dir), demo_config(demo_dir, objective, seed), progress=False, batch_size=2, **options
    )


def run(name: str, objective, seed: int):
    return SEARCHES[name](objective, BUDGET, seed=seed, progress=False, **FAST_OPTIONS.get(name, {}))


PANEL = ("greedy", "beam", "one_shot", "genetic", "bayesian", "cbo", "fast_block_select", "exhaustive")
"""The study's seven and exhaustive, rankings first (on a cold memo), so that the searches needing values
later complete the bounds the rankings left."""


@pytest.mark.slow
@pytest.mark.parametrize("objective", OBJECTIVES)
def test_every_search_selects_and_reports_the_same_with_and_without_shortcuts(demo_tiny_dir, objective):
    """Seeds 0-2 of both the calibration draw and the searches; the panel on one evaluator per mode, as
    ``prune --search all`` runs it; fewer block-forwards with the shortcuts."""
    from pruning.pipeline.prune import run_searches

    assert set(STUDY_SEARCHES) < set(PANEL)
    for seed in range(3):
        outcomes, forwards, stopped = {}, {}, {}
        for shortcuts in (False, True):
            shared = evaluator(demo_tiny_dir, objective, seed, shortcuts=shortcuts)
            before = shared.stats.block_forwards
            panel = tuple(name for name in PANEL if not (objective == "kl" and name == "cbo"))  # refuses kl
            runs = run_searches(shared, BUDGET, panel, seed=seed, options=FAST_OPTIONS, progress=False)
            outcomes[shortcuts] = [(run.search, run.result.removed_blocks, run.result.loss) for run in runs]
            forwards[shortcuts] = shared.stats.block_forwards - before
            stopped[shortcuts] = (shared.stats.stopped_early, sum(run.stopped_early for run in runs))
        assert outcomes[True] == outcomes[False], (objective, seed)
        assert forwards[True] < forwards[False]
        assert stopped[False] == (0, 0)
        if objective == "kl":  # KL is near 0 for good sets: bad ones stop after a batch or two
            assert stopped[True][0] > 0 and stopped[True][1] > 0
        if objective == "task_margin":  # a margin has no floor: nothing may stop
            assert stopped[True] == (0, 0)


@pytest.mark.parametrize("objective", ["perplexity", "kl"])
@pytest.mark.parametrize("name", ["one_shot", "greedy", "beam"])
def test_rankings_standalone_select_the_same(demo_tiny_dir, objective, name):
    """Each ranking search alone on a cold memo (one-shot then ranks the single blocks itself)."""
    plain = run(name, evaluator(demo_tiny_dir, objective, 1, shortcuts=False), 1)
    fast = run(name, evaluator(demo_tiny_dir, objective, 1), 1)
    assert (fast.removed_blocks, fast.loss) == (plain.removed_blocks, plain.loss)


BOUNDED = {
    "task_ce": {},
    "task_margin-clip": {"margin_clip": 0.5},
    "task_ce-kl": {"kl_weight": 0.5},
    "task_margin-kl": {"kl_weight": 2.0},
    "perplexity-kl": {"kl_weight": 1.0},
}
"""The bounded and KL-added configurations (name: parameters), each checked against ``--no-shortcuts``."""


@pytest.mark.parametrize("configuration", sorted(BOUNDED))
def test_bounded_objectives_select_the_same_with_and_without_shortcuts(demo_tiny_dir, configuration):
    """greedy, then one_shot on the same evaluator (as ``prune --search greedy,one_shot`` runs them)."""
    objective = configuration.split("-")[0]
    data = "demo:text" if objective == "perplexity" else "demo:qa"
    config = CalibrationConfig(
        objective, f"{data}@{demo_tiny_dir}", samples=8, seq_len=64, seed=1, **BOUNDED[configuration]
    )
    found = {}
    for shortcuts in (False, True):
        evaluator = build_evaluator(
            str(demo_tiny_dir), config, progress=False, batch_size=2, shortcuts=shortcuts
        )
        results = [run(name, evaluator, 1) for name in ("greedy", "one_shot")]
        selections = [(result.removed_blocks, result.loss) for result in results]
        found[shortcuts] = (selections, evaluator.stats.stopped_early)
    assert found[True][0] == found[False][0]
    assert found[False][1] == 0
    if config.loss_floor is not None:
        assert found[True][1] > 0, "a floor lets the rankings stop hopeless candidates"


def greedy_stopped(demo_dir, objective="kl"):
    """A shortcut evaluator after greedy, and the candidates greedy's rankings stopped early."""
    shortcut = evaluator(demo_dir, objective)
    result = run("greedy", shortcut, 0)
    stopped = []
    for step in result.history:
        chosen_before = [entry["chosen"] for entry in result.history[: step["step"]]]
        stopped += [frozenset({*chosen_before, int(block)}) for block in step.get("stopped", {})]
    return shortcut, stopped


def test_a_stopped_candidate_is_a_bound_never_a_value(demo_tiny_dir, tmp_path):
    shortcut, stopped = greedy_stopped(demo_tiny_dir)
    assert stopped, "the kl objective on the demo model stops some greedy candidates"
    plain = evaluator(demo_tiny_dir, "kl", shortcuts=False)
    saved = json.loads(shortcut.save_memo(tmp_path / "memo.json").read_text())
    values = {frozenset(entry["removed"]) for entry in saved["scores"]}
    bounds = {frozenset(entry["removed"]): entry["lower_bound"] for entry in saved["bounds"]}
    for removed in stopped:
        bound = shortcut.lower_bound(removed)
        assert removed not in values and bounds[removed] == bound
        exact = plain.score(removed)
        assert bound <= exact  # a lower bound indeed
        # A value is asked for: scored to the end from where it stopped, to the very value.
        completed_before = shortcut.stats.bounds_completed
        assert shortcut.score(removed) == exact
        assert (
            shortcut.stats.bounds_completed == completed_before + 1 and shortcut.lower_bound(removed) is None
        )

    # A memo file's bounds stay bounds: a fresh evaluator answers the ranking from them, then completes.
    fresh = evaluator(demo_tiny_dir, "kl")
    fresh.load_memo(tmp_path / "memo.json")
    removed = stopped[0]
    assert fresh.lower_bound(removed) == pytest.approx(bounds[removed])
    assert fresh.score(removed) == plain.score(removed)


def test_a_bound_from_a_resumed_run_answers_the_same_ranking_without_scoring(demo_tiny_dir, tmp_path):
    shortcut, stopped = greedy_stopped(demo_tiny_dir)
    shortcut.save_memo(tmp_path / "memo.json")
    fresh = evaluator(demo_tiny_dir, "kl")
    fresh.load_memo(tmp_path / "memo.json")
    before = fresh.stats.block_forwards
    again = run("greedy", fresh, 0)
    assert fresh.stats.block_forwards == before  # every candidate a value or a bound from the file
    assert (
        again.removed_blocks
        == run("greedy", evaluator(demo_tiny_dir, "kl", shortcuts=False), 0).removed_blocks
    )


def random_sets(num_blocks: int, count: int, seed: int) -> list[frozenset[int]]:
    rng = random.Random(seed)
    sets = [frozenset(rng.sample(range(num_blocks), rng.randint(1, num_blocks - 1))) for _ in range(count)]
    return [*sets, frozenset(), sets[0], frozenset({0}), frozenset({num_blocks - 1})]


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_trie_scores_equal_one_by_one_and_naive(demo_tiny_dir, objective):
    shortcut = evaluator(demo_tiny_dir, objective)
    plain = evaluator(demo_tiny_dir, objective, shortcuts=False)
    naive = evaluator(demo_tiny_dir, objective, naive=True)
    sets = random_sets(shortcut.num_blocks, 24, seed=3)
    before = shortcut.stats.block_forwards
    grouped = shortcut.score_many(sets)
    shared_cost = shortcut.stats.block_forwards - before
    before = plain.stats.block_forwards
    assert grouped == [plain.score(removed) for removed in sets]  # bit for bit
    assert shared_cost < plain.stats.block_forwards - before
    np.testing.assert_allclose(grouped, [naive.score(removed) for removed in sets], atol=1e-5)
    # Sets sharing prefixes with remembered nodes, one by one: still the same values.
    later = random_sets(shortcut.num_blocks, 12, seed=4)
    assert [shortcut.score(removed) for removed in later] == [plain.score(removed) for removed in later]


def test_trie_scheduler_on_a_random_model_and_a_starved_cache(tiny_model_dirs, tmp_path):
    """A random llama; the node capacity 0 (only boundary 0 cached) and 3 (bases kept in part)."""
    from depthprune.testing.data import random_texts, write_jsonl

    text = write_jsonl(tmp_path / "text.jsonl", random_texts(random.Random(0), rows=10, words=60))
    config = CalibrationConfig("perplexity", f"text:{text}", samples=6, seq_len=24, seed=1)
    model = str(tiny_model_dirs("llama"))
    plain = build_evaluator(model, config, progress=False, batch_size=2, shortcuts=False)
    per_boundary = plain.cache_bytes // len(plain.boundaries)
    sets = random_sets(plain.num_blocks, 20, seed=5)
    expected = [plain.score(removed) for removed in sets]
    for budget_bytes, capacity in ((0, 0), ((plain.num_blocks + 3) * per_boundary, 3)):
        shortcut = build_evaluator(
            model, config, progress=False, batch_size=2, memory_budget_gb=budget_bytes / 2**30
        )
        assert shortcut.prefix_capacity == capacity
        assert shortcut.score_many(sets) == expected
        for name in ("greedy", "beam"):
            plain_result = run(
                name, build_evaluator(model, config, progress=False, batch_size=2, shortcuts=False), 0
            )
            assert run(name, shortcut, 0).removed_blocks == plain_result.removed_blocks


@pytest.mark.parametrize("objective", ["perplexity", "kl"])
def test_rank_lowest_returns_exactly_the_k_lowest(demo_tiny_dir, objective):
    plain = evaluator(demo_tiny_dir, objective, shortcuts=False)
    subsets = [frozenset(subset) for subset in itertools.combinations(range(plain.num_blocks), 3)]
    exact = dict(zip(subsets, plain.score_many(subsets)))
    ordered = sorted(exact.values())
    for keep in (1, 5, 20):
        shortcut = evaluator(demo_tiny_dir, objective)
        answers = rank_lowest(shortcut, subsets, keep)
        complete = {removed: answer.loss for removed, answer in zip(subsets, answers) if answer.exact}
        assert sorted(complete.values())[:keep] == ordered[:keep]
        for removed, answer in zip(subsets, answers):
            assert answer.loss <= exact[removed] + 1e-12
            if answer.exact:
                assert answer.loss == exact[removed]
            else:  # a bound above the k-th lowest, and never a memo value
                assert answer.loss > ordered[keep - 1] and shortcut.lower_bound(removed) == answer.loss


def test_margin_rankings_score_everything_and_tracked_counts(demo_tiny_dir):
    shortcut = evaluator(demo_tiny_dir, "task_margin")
    assert shortcut.objective.loss_floor is None and shortcut.loss_floor is None
    tracked = TrackedObjective(shortcut)
    subsets = [frozenset({block, 5}) for block in range(5)]
    answers = rank_lowest(tracked, subsets, 1, bases=[frozenset({5})])
    assert all(answer.exact for answer in answers) and tracked.stopped_early == 0
    assert tracked.subset_evaluations == 5 and shortcut.stats.evaluations == 5


def test_trie_order_and_branch_points():
    sets = [(1, 4), (0, 2), (1,), (1, 3), (0, 2, 5), (2,)]
    ordered = trie_order(sets, 6)
    assert ordered == [(0, 2, 5), (0, 2), (1, 3), (1, 4), (1,), (2,)]
    assert shared_depth((1, 3), (1, 4), 6) == 3 and shared_depth((0, 2), (0, 2), 6) == 6
    points = branch_points(ordered, 6)
    for index in range(len(ordered)):
        later = [shared_depth(ordered[index], other, 6) for other in ordered[index + 1 :]]
        # every later set's branch depth from this one is reachable from the stack (a running minimum)
        running = sorted({min(later[: end + 1]) for end in range(len(later))}, reverse=True)
        assert points[index] == running
    assert spaced([3, 4, 5, 6, 7, 8], 3) == [3, 5, 7] and spaced([1, 2], 5) == [1, 2] and spaced([1], 0) == []


def test_prune_no_shortcuts_gives_the_same_variants(demo_tiny_dir, run_cli, tmp_path, monkeypatch):
    """``prune --no-shortcuts`` and the default agree (each in its own home: no memo shared); --json
    carries the accounting."""
    args = [
        "prune",
        "--model",
        demo_tiny_dir,
        "--objective",
        "kl",
        "--data",
        f"demo:text@{demo_tiny_dir}",
        "--drop",
        "3",
        "--search",
        "one_shot,greedy,beam",
        "--samples",
        "8",
        "--seq-len",
        "32",
        "--json",
    ]
    reports = {}
    for flag in ("--shortcuts", "--no-shortcuts"):
        monkeypatch.setenv("DEPTHPRUNE_HOME", str(tmp_path / flag.strip("-")))
        code, out, err = run_cli(*args, flag)
        assert code == 0, err
        reports[flag] = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    for fast, plain in zip(reports["--shortcuts"], reports["--no-shortcuts"]):
        assert (fast["search"], fast["removed_blocks"], fast["calibration_loss"]) == (
            plain["search"],
            plain["removed_blocks"],
            plain["calibration_loss"],
        )
        assert fast["shortcuts"] is True and plain["shortcuts"] is False and plain["stopped_early"] == 0
        assert fast["options"]["cost"]["stopped_early"] == fast["stopped_early"]
        assert fast["head_positions"] > 0 and fast["options"]["shortcuts"] is True


def test_greedy_and_beam_hold_the_states_of_their_current_bases_only(demo_tiny_dir):
    """A base the search has left is never extended again: its states go, so greedy holds at most one path
    of N - 1 boundary states beyond the dense cache and beam one per base (the planner's bound)."""
    for name, width in (("greedy", 1), ("beam", 5)):
        scorer = evaluator(demo_tiny_dir, "perplexity")
        per_boundary = scorer.cache_bytes // len(scorer.boundaries)
        assert scorer.prefix_capacity > width * scorer.num_blocks  # the budget would hold the stale ones
        run(name, scorer, 0)
        assert 0 < scorer.search_state_bytes_most <= width * (scorer.num_blocks - 1) * per_boundary


def test_leaving_a_base_forgets_its_states_and_keeps_the_shared_prefix():
    import torch

    from pruning.calibration.scoring.shortcuts import PrefixStates

    dense = [{0: torch.zeros(2, 4)}]
    prefix = PrefixStates(dense, [0], num_blocks=6, capacity=10)
    state = [torch.zeros(2, 4)]
    for boundary in (2, 3, 4, 5):  # the states of base {1} past it
        prefix.remember((1,), boundary, state, base=True)
    prefix.remember((0, 4), 5, state)  # a scored set's node, not a base's
    assert prefix.bytes_held == prefix.most_bytes_held == 5 * state[0].nbytes
    prefix.forget_bases_off([(1, 3)])  # greedy moved on to {1, 3}: boundaries 2 and 3 stay on its path
    assert set(prefix.nodes) == {(2, (1,)), (3, (1,)), (5, (0, 4))}
    assert prefix.bytes_held == 3 * state[0].nbytes and prefix.most_bytes_held == 5 * state[0].nbytes
