"""Minibatch scores: a removal set's mean loss over a few calibration samples (EvoPress's fitness).

Only the calibration batches holding the samples run, each whole (a batch's sequences are one forward),
and with shortcuts depth first through the trie of the sets (:mod:`.trie_walk`). Every per-sample loss a
set's batches gave is kept in the :class:`~.score_book.ScoreBook` (and saved with the memo), so a set scored
again on another minibatch (EvoPress's parents, its survivors) runs only the batches it has not run yet.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from pruning.calibration.scoring.packing import RunBatch
from pruning.calibration.scoring.score_book import RemovalSet, ScoreBook
from pruning.calibration.scoring.shortcuts import trie_order
from pruning.calibration.scoring.trie_walk import TrieWalk

NaiveLosses = Callable[[RemovalSet, int], torch.Tensor]
"""``(removed, batch index) -> per-sample losses`` of one batch by a full forward (naive mode)."""


def checked_samples(samples: Iterable[int], num_samples: int) -> list[int]:
    """The sample indices, sorted; a ValueError for none, a repeat or one out of range."""
    indices = sorted(int(sample) for sample in samples)
    if not indices:
        raise ValueError("score_samples needs at least one sample")
    if len(set(indices)) != len(indices):
        raise ValueError(f"repeated sample indices in {indices}")
    if not 0 <= indices[0] <= indices[-1] < num_samples:
        raise ValueError(f"sample indices must be in 0..{num_samples - 1}, got {indices}")
    return indices


def sample_ranges(run_batches: list[RunBatch]) -> list[range]:
    """The calibration sample indices each run batch holds (samples in calibration order)."""
    ranges, first = [], 0
    for run in run_batches:
        ranges.append(range(first, first + run.calibration.num_samples))
        first += run.calibration.num_samples
    return ranges


class MinibatchScores:
    """Fills a :class:`~.score_book.ScoreBook`'s per-sample losses for sets on given samples.

    Args:
        book: where the per-sample losses go (and the bounds whose batches are reused).
        run_batches: what the blocks run.
        walk: the trie walk (with shortcuts a group of sets shares its prefixes; without, one set at a time).
        naive_losses: in naive mode, what scores a batch instead of the walk; else None.
        shortcuts: whether the sets of a batch run as one trie group.
    """

    def __init__(
        self,
        book: ScoreBook,
        run_batches: list[RunBatch],
        walk: TrieWalk | None,
        naive_losses: NaiveLosses | None,
        shortcuts: bool,
    ):
        self.book = book
        self.walk = walk
        self.naive_losses = naive_losses
        self.shortcuts = shortcuts
        self.ranges = sample_ranges(run_batches)

    def fill(self, sets: list[RemovalSet], indices: list[int]) -> None:
        """Run, for each of ``sets``, the batches holding ``indices`` it has no per-sample losses of."""
        for batch_index, batch_samples in enumerate(self.ranges):
            wanted = [index for index in indices if index in batch_samples]
            missing = [removed for removed in sets if not self.book.knows(removed, wanted)]
            if missing:
                self._run_batch(list(dict.fromkeys(missing)), batch_index, batch_samples)

    def _run_batch(self, sets: list[RemovalSet], batch_index: int, samples: range) -> None:
        """Per-sample losses of one batch for each of ``sets``, into the book."""
        pending = []
        for removed in sets:
            partial = self.book.bounds.get(removed)
            if partial is not None and batch_index in partial.losses:  # a ranking query ran this batch
                self.book.keep_sample_losses(removed, samples, partial.losses[batch_index])
            else:
                pending.append(removed)
        if self.naive_losses is not None:
            computed = [self.naive_losses(removed, batch_index) for removed in pending]
        else:
            prefixes = {tuple(sorted(removed)): removed for removed in pending}
            # One set at a time without shortcuts, as score() runs them; a trie group with them.
            if self.shortcuts:
                groups = [trie_order(list(prefixes), self.walk.num_blocks)]
            else:
                groups = [[prefix] for prefix in prefixes]
            pending, computed = [], []
            for ordered in groups:
                pending += [prefixes[prefix] for prefix in ordered]
                computed += self.walk.run_batch(ordered, batch_index)
        for removed, losses in zip(pending, computed, strict=True):
            self.book.keep_sample_losses(removed, samples, losses)
