"""Scoring removal sets by walking the trie of removal sets, batch by batch, from the deepest cached state.

The hidden state entering block k with the blocks R removed depends only on R ∩ [0, k), so a group of sets
runs depth first through the trie of their removed blocks (:func:`~.shortcuts.trie_order`): a prefix several
of them share is computed once per batch, and each set starts from the deepest state on its path, a cached
node (:class:`~.shortcuts.PrefixStates`: the dense boundaries, the bases a search extends) or a state an
earlier set of the group left where this one branches off. Batches run in decreasing dense loss, so that a
ranking query can stop a hopeless set at a lower bound after as few batches as possible (:mod:`.score_book`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from pruning.calibration.scoring.dense_pass import DenseReference
from pruning.calibration.scoring.packing import RunBatch
from pruning.calibration.scoring.runner import BlockRunner
from pruning.calibration.scoring.score_book import RemovalSet, ScoreBook
from pruning.calibration.scoring.shortcuts import (
    LowestLosses,
    Prefix,
    branch_points,
    exceeds,
    spaced,
    trie_order,
)

Nodes = dict[tuple[Prefix, int], dict[int, torch.Tensor]]
"""States a group computed, ``(set, boundary) -> {batch index: state}``, to become trie nodes."""


class TrieWalk:
    """Scores groups of removal sets through the trie, into a :class:`~.score_book.ScoreBook`.

    Args:
        runner: the model's blocks.
        run_batches: what the blocks run.
        dense: the dense reference pass (boundary states, block arguments, KL reference, batch order).
        loss: the configured loss, ``loss(batch, hidden, head, reference) -> per-sample losses``.
        book: where values and bounds go.
    """

    def __init__(
        self,
        runner: BlockRunner,
        run_batches: list[RunBatch],
        dense: DenseReference,
        loss: Callable,
        book: ScoreBook,
    ):
        self.runner = runner
        self.run_batches = run_batches
        self.block_kwargs = dense.block_kwargs()
        self.prefix = dense.prefix_states()
        """The trie nodes kept: the dense boundary cache and the states of the bases searches extend."""
        self.reference = dense.reference
        self.cache_device = dense.plan.device
        self.batch_order = dense.batch_order()
        self.loss = loss
        self.book = book
        self.num_blocks = runner.num_blocks

    def rank_by_prior(self, sets: list[RemovalSet], keep: int, prior: np.ndarray) -> None:
        """A ranking query's scoring: best ``prior`` (summed over a set's blocks) first, ``keep`` at a time,
        each group stopping its sets whose bound exceeds the ``keep``-th lowest loss so far."""
        values = self.book.values
        ordered = sorted(
            dict.fromkeys(sets), key=lambda removed: (float(sum(prior[i] for i in removed)), sorted(removed))
        )
        lowest = LowestLosses(keep)
        pending = []
        for removed in ordered:
            if removed in values:
                self.book.stats.memo_hits += 1
                lowest.add(values[removed])
            else:
                pending.append(removed)
        for first in range(0, len(pending), keep):
            group = pending[first : first + keep]
            self.score_group(group, lowest.threshold)
            for removed in group:
                if removed in self.book.values:
                    lowest.add(self.book.values[removed])

    def score_group(
        self, group: list[RemovalSet], threshold: float | None = None, remember: bool = False
    ) -> None:
        """Score ``group`` (sets not memoised) batch by batch, depth first through the trie.

        Completed sets go to the memo. With a ``threshold`` (a ranking query), a set whose lower bound
        exceeds it before its last batch stops there and goes to the bounds, partial losses kept, so
        that scoring it again resumes at its next batch. With ``remember``, the states the group computed
        become trie nodes (as many as the budget holds), for later sets sharing their prefixes.
        """
        book = self.book
        partials, resumed = book.open(group)
        prefixes = {tuple(sorted(removed)): removed for removed in group}
        stopped: set[RemovalSet] = set()
        # Nodes are kept where the cache lives; copying every state off the device would cost more.
        nodes: Nodes | None = (
            {} if remember and self.prefix.capacity and self.cache_device == self.runner.device else None
        )
        for step, batch_index in enumerate(self.batch_order):
            active = []
            for prefix, removed in prefixes.items():
                partial = partials[removed]
                if removed in stopped or partial.batches_done != step:
                    continue
                if threshold is not None and exceeds(
                    partial.lower_bound(book.num_samples, book.loss_floor), threshold
                ):
                    stopped.add(removed)
                    continue
                active.append(prefix)
            ordered = trie_order(active, self.num_blocks)
            for prefix, losses in zip(ordered, self.run_batch(ordered, batch_index, nodes)):
                partials[prefixes[prefix]].losses[batch_index] = losses
        book.close(partials, resumed, len(self.run_batches))
        for (prefix, boundary), states in (nodes or {}).items():
            if len(states) == len(self.run_batches):  # batches run in batch_order; nodes list them by index
                self.prefix.remember(prefix, boundary, [states[index] for index in range(len(states))])

    def run_batch(
        self, ordered: list[Prefix], batch_index: int, nodes: Nodes | None = None
    ) -> list[torch.Tensor]:
        """Per-sample losses of one batch for each set of ``ordered`` (a :func:`trie_order`).

        Each set starts from the deepest state on its path: a cached node, or a state an earlier set of
        the group left on the stack at a boundary where this one branches off. The stack only ever holds
        states of the current set's path (≤ N states of one batch). ``nodes``, when given, collects the
        states each set computed, ``(set, boundary) -> {batch index: state}``, up to the node capacity.
        """
        run = self.run_batches[batch_index]
        reference = self.reference.for_batch(batch_index)
        points = branch_points(ordered, self.num_blocks)
        stack: list[tuple[int, torch.Tensor]] = []
        results = []
        for position, removed in enumerate(ordered):
            if position:
                shared = min(set(removed) ^ set(ordered[position - 1]), default=self.num_blocks)
                while stack and stack[-1][0] > shared:
                    stack.pop()
            start, states = self.prefix.start(removed)
            if stack and stack[-1][0] >= start:
                start, hidden = stack[-1]
            else:
                hidden = states[batch_index].to(self.runner.device)
            keep_at = {point for point in points[position] if point > start}
            hidden = self._run_path(hidden, start, removed, batch_index, keep_at, stack, nodes)
            results.append(
                self.loss(run.calibration, run.objective_hidden(hidden), self.runner.head, reference)
            )
        return results

    def _run_path(
        self,
        hidden: torch.Tensor,
        start: int,
        removed: Prefix,
        batch_index: int,
        keep_at: set[int],
        stack: list[tuple[int, torch.Tensor]],
        nodes: Nodes | None,
    ) -> torch.Tensor:
        """Run the blocks of one batch from boundary ``start`` to the end with ``removed`` skipped.

        The states entering the blocks in ``keep_at`` are pushed on ``stack``; with ``nodes``, the state at
        each boundary past ``start`` (one per distinct state) is collected while the capacity allows.
        """
        removed_set = set(removed)
        kwargs = self.block_kwargs[batch_index]
        blocks = 0
        for index in range(start, self.num_blocks):
            if index in keep_at:
                stack.append((index, hidden))
            if (
                nodes is not None
                and index > start
                and index - 1 not in removed_set
                and ((removed, index) in nodes or len(nodes) < self.prefix.capacity)
            ):
                nodes.setdefault((removed, index), {})[batch_index] = hidden.to(self.cache_device)
            if index in removed_set:
                continue
            hidden = self.runner.block(index, hidden, kwargs[index])
            blocks += 1
        self.runner.count_blocks(self.run_batches[batch_index], blocks)
        return hidden

    def extend_from(self, bases: list[RemovalSet]) -> None:
        """Keep the states of ``bases``, the sets the next candidates extend by one block (forgetting those
        of earlier bases off their paths), so that a candidate base ∪ {j} starts at block j."""
        self.prefix.forget_bases_off([tuple(sorted(base)) for base in bases])
        for base in bases:
            self.materialise(base)

    def materialise(self, base: RemovalSet) -> None:
        """Cache the states of ``base`` at its boundaries past its deepest cached node, as many as the
        budget holds (evenly spaced when not all), so that a candidate base ∪ {j} starts at block j."""
        if not base or self.prefix.capacity == 0:
            return
        removed = tuple(sorted(base))
        start, states = self.prefix.start(removed)
        # Past a removed block the state is the one before it: no node of its own.
        wanted = spaced(
            [k for k in range(start + 1, self.num_blocks) if k - 1 not in base], self.prefix.capacity
        )
        if not wanted:
            return
        nodes: dict[int, list[torch.Tensor]] = {boundary: [] for boundary in wanted}
        for batch_index, run in enumerate(self.run_batches):
            hidden = states[batch_index].to(self.runner.device)
            blocks = 0
            for index in range(start, wanted[-1]):
                if index not in base:
                    hidden = self.runner.block(index, hidden, self.block_kwargs[batch_index][index])
                    blocks += 1
                if index + 1 in nodes:
                    nodes[index + 1].append(hidden.to(self.cache_device))
            self.runner.count_blocks(run, blocks)
        for boundary in wanted:
            self.prefix.remember(removed, boundary, nodes[boundary], base=True)
