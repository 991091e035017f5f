"""EvoPress's minibatch fitness through the subset evaluator (``score_samples``, issue 15 fix 9).

On the tiny demo model: a set's loss on every sample is its full loss; the loss on a minibatch is the mean
of the per-sample losses (so averaging one-sample scores gives the full loss); only the batches holding the
minibatch run, and a batch a set already ran is not run again, nor after a resume from the saved memo;
evolution screens its offspring on minibatches (``screen="auto"`` picks ``samples``) for fewer
block-forwards than selecting on the full loss, and still reports the full loss of the set it returns.
"""

from __future__ import annotations

import numpy as np
import pytest

from pruning.calibration.config import CalibrationConfig
from pruning.calibration.scoring.build import build_evaluator
from pruning.search import SEARCHES, TrackedObjective
from pruning.search.base import SampleScoringObjective

SETS = [frozenset({1, 3}), frozenset({0}), frozenset({2, 4, 5}), frozenset()]


def evaluator(demo_dir, objective: str = "perplexity", **options):
    """8 samples in 4 batches of 2 sequences (2 items a batch for task_margin)."""
    data = "demo:qa" if objective == "task_margin" else "demo:text"
    config = CalibrationConfig(objective, f"{data}@{demo_dir}", samples=8, seq_len=32, seed=0)
    return build_evaluator(str(demo_dir), config, progress=False, batch_size=2, **options)


@pytest.mark.parametrize("objective", ["perplexity", "kl", "task_margin"])
def test_every_sample_is_the_full_loss_and_minibatches_average(demo_tiny_dir, objective):
    fast = evaluator(demo_tiny_dir, objective)
    assert isinstance(fast, SampleScoringObjective) and fast.num_samples == 8
    everything = list(range(fast.num_samples))
    for removed in SETS:
        assert fast.score_samples(removed, everything) == fast.score(removed)
        singles = [fast.score_samples(removed, [sample]) for sample in everything]
        assert np.mean(singles) == pytest.approx(fast.score(removed), rel=1e-6, abs=1e-9)
        assert fast.score_samples(removed, [5, 2]) == pytest.approx(np.mean([singles[2], singles[5]]))
    # the trie group gives what one set at a time gives, and so do the naive and shortcut-free evaluators
    grouped = fast.score_samples_many(SETS, [1, 6, 7])
    for other in (evaluator(demo_tiny_dir, objective, shortcuts=False), fast):
        assert [other.score_samples(removed, [1, 6, 7]) for removed in SETS] == pytest.approx(grouped)
    naive = evaluator(demo_tiny_dir, objective, naive=True)
    assert naive.score_samples_many(SETS, [1, 6, 7]) == pytest.approx(grouped, rel=1e-5, abs=1e-6)


def test_only_the_batches_holding_the_minibatch_run_and_never_twice(demo_tiny_dir, tmp_path):
    fast = evaluator(demo_tiny_dir)
    removed = frozenset({1, 3})
    kept_blocks = fast.num_blocks - len(removed)
    before = fast.stats.block_forwards
    fast.score_samples(removed, [4, 5])  # both in batch 2
    one_batch = fast.stats.block_forwards - before
    assert 0 < one_batch <= kept_blocks
    fast.score_samples(removed, [4])
    assert fast.stats.block_forwards - before == one_batch  # batch 2 is known for this set
    fast.score_samples(removed, [0, 5, 7])  # batches 0 and 3 are new
    assert fast.stats.block_forwards - before <= 3 * kept_blocks
    assert fast.stats.evaluations == 0 and removed not in fast._memo  # a minibatch is never a memo value
    # saved with the memo: a resumed run scores the same minibatches without a forward
    expected = fast.score_samples(removed, [0, 4, 5, 7])
    resumed = evaluator(demo_tiny_dir)
    resumed.load_memo(fast.save_memo(tmp_path / "memo.json"))
    before = resumed.stats.block_forwards
    assert resumed.score_samples(removed, [0, 4, 5, 7]) == expected
    assert resumed.stats.block_forwards == before and removed not in resumed._memo
    for bad in ([], [8], [-1], [2, 2]):
        with pytest.raises(ValueError):
            fast.score_samples(removed, bad)


def test_evolution_screens_on_minibatches_for_fewer_block_forwards(demo_tiny_dir):
    options = {"generations": 3, "offspring": 8, "initial": 8, "samples_per_selection": (1, 4)}
    results, forwards = {}, {}
    for screen in ("auto", "none"):
        fast = evaluator(demo_tiny_dir)
        before = fast.stats.block_forwards
        tracked = TrackedObjective(fast)
        results[screen] = SEARCHES["evolution"](tracked, 3, seed=0, progress=False, screen=screen, **options)
        forwards[screen] = fast.stats.block_forwards - before
        # the sets screened on minibatches were asked for too (the 8 distinct initial sets, at least)
        assert tracked.subset_evaluations >= 8
        assert results[screen].loss == fast.score(frozenset(results[screen].removed_blocks))  # the full loss
    screened = results["auto"]
    assert screened.options["screen"] == "samples" and screened.options["minibatch_scores"] > 0
    assert results["none"].options["screen"] == "none"
    # 8 samples in 4 batches: a 1-sample screen runs 1 batch of 4, the 4-sample step most of them
    assert forwards["auto"] < 0.75 * forwards["none"]
