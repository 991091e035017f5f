"""The subset evaluator's exact shortcuts: cached boundaries, shared prefix states (a trie of removal sets)
and lower bounds.

**Shared prefixes.** The hidden state entering block k of a model with the blocks R removed depends only
on R ∩ [0, k). Removal sets are therefore the leaves of a trie whose depth-k nodes are those prefixes, and
two sets whose removed blocks agree below k share the whole forward up to block k. :class:`PrefixStates`
keeps such node states for every calibration batch: the dense boundaries of the evaluator's reference
pass (the prefix ∅), plus, within a memory budget and least recently used first out, the boundaries of the
*bases* a search extends (greedy's current set, beam's states). :func:`trie_order` and
:func:`branch_points` schedule a group of sets depth first through that trie, so that a prefix the group
shares is computed once per batch (a GA generation, exhaustive search's subsets).

**Bounds.** When every per-sample loss is at least a known floor (the objective's ``loss_floor``: perplexity ≥
0 exactly, since a log-softmax is never positive; KL ≥ 0 up to rounding), the losses of the calibration
batches scored so far, plus the floor for every sample not yet scored, give a lower bound of the final loss
(:class:`PartialScore`). A search that only needs a ranking (greedy's argmin, beam's top B, one-shot's M
lowest, exhaustive's minimum) can stop scoring a candidate once that bound exceeds the k-th best complete
loss: it cannot be chosen. Stopped candidates keep their partial losses, so a later request for the value
completes them from where they stopped, to the very value a full scoring gives.
"""

from __future__ import annotations

import bisect
import math
import os
from collections import OrderedDict
from dataclasses import dataclass, field

import torch

BOUND_TOLERANCE = 1e-9
"""Relative margin before a bound counts as above the k-th best loss: a bound is a double sum in another
order than the final mean's, so an exact tie must never look like an excess."""


def available_memory_bytes() -> int:
    """Host memory available now (psutil when installed, else the page counts of the OS)."""
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:  # pragma: no cover - psutil comes with the pinned environment
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def device_free_bytes(device) -> int:
    """Memory free where ``device``'s tensors live: the card's (``torch.cuda.mem_get_info``) off the CPU, else
    the host's (:func:`available_memory_bytes`)."""
    device = torch.device(device)
    if device.type != "cpu":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    return available_memory_bytes()


def plan_boundaries(num_blocks: int, slots: int) -> list[int]:
    """Which block boundaries to cache when only ``slots`` fit: evenly spaced, always including 0.

    Boundary ``k`` is the hidden state entering block ``k`` (0 is the embedding output).
    """
    if slots >= num_blocks:
        return list(range(num_blocks))
    slots = max(slots, 1)
    return sorted({math.floor(j * num_blocks / slots) for j in range(slots)})


@dataclass
class PartialScore:
    """The per-sample losses of the calibration batches of one removal set scored so far."""

    losses: dict[int, torch.Tensor] = field(default_factory=dict)
    """Batch index -> the objective's per-sample losses of that batch."""
    recorded_bound: float = float("-inf")
    """A lower bound known without the losses (one read back from a saved memo)."""

    @property
    def batches_done(self) -> int:
        return len(self.losses)

    def lower_bound(self, num_samples: int, floor: float) -> float:
        """The mean loss over ``num_samples`` is at least this: scored samples plus ``floor`` for the rest."""
        if not self.losses:
            return max(self.recorded_bound, floor)
        scored = torch.cat(list(self.losses.values())).double()
        bound = (float(scored.sum()) + floor * (num_samples - scored.numel())) / num_samples
        return max(bound, self.recorded_bound)

    def value(self) -> float:
        """The loss once every batch is scored: the mean of all per-sample losses, in batch order."""
        return float(torch.cat([self.losses[index] for index in sorted(self.losses)]).double().mean())


def exceeds(bound: float, threshold: float) -> bool:
    """Whether a lower ``bound`` rules a candidate out against the k-th best loss ``threshold``."""
    return bound > threshold + BOUND_TOLERANCE * max(1.0, abs(threshold))


class LowestLosses:
    """The ``keep`` lowest complete losses seen so far; :attr:`threshold` is the k-th (∞ until k are seen)."""

    def __init__(self, keep: int):
        self.keep = keep
        self.losses: list[float] = []

    def add(self, loss: float) -> None:
        bisect.insort(self.losses, loss)
        del self.losses[self.keep :]

    @property
    def threshold(self) -> float:
        return self.losses[-1] if len(self.losses) == self.keep else float("inf")


Prefix = tuple[int, ...]
"""A removal set as its sorted block indices."""


def trie_order(removed_sets: list[Prefix], num_blocks: int) -> list[Prefix]:
    """The sets in depth-first order of the trie (at each block, "removed" before "kept").

    Sorting by the sorted indices followed by ``num_blocks`` is exactly that order, so a set's shared
    depth with any later set is the minimum of the consecutive shared depths in between.
    """
    return sorted(removed_sets, key=lambda removed: (*removed, num_blocks))


def shared_depth(first: Prefix, second: Prefix, num_blocks: int) -> int:
    """The deepest boundary where both sets have the same state: the first block only one removes."""
    differing = set(first) ^ set(second)
    return min(differing) if differing else num_blocks


def branch_points(ordered: list[Prefix], num_blocks: int) -> list[list[int]]:
    """Per set of a :func:`trie_order`, the boundaries (deepest first) where later sets branch off it.

    The state of set i at such a boundary is what a later set continues from. They are the distinct
    running minima of the consecutive shared depths after i, found through next-smaller links.
    """
    depths = [shared_depth(a, b, num_blocks) for a, b in zip(ordered, ordered[1:])]
    next_smaller = [len(depths)] * len(depths)
    pending: list[int] = []
    for index, depth in enumerate(depths):
        while pending and depths[pending[-1]] > depth:
            next_smaller[pending.pop()] = index
        pending.append(index)
    points = []
    for index in range(len(ordered)):
        chain, link = [], index
        while link < len(depths):
            chain.append(depths[link])
            link = next_smaller[link]
        points.append(chain)
    return points


class PrefixStates:
    """Trie nodes: the state entering block k with the blocks of a prefix (all below k) removed, per batch.

    The dense nodes are the evaluator's boundary cache (never evicted). Other nodes are added by
    :meth:`remember`, at most ``capacity`` of them, the least recently used evicted first. Nodes kept for
    the bases a search extends (greedy's removal set, beam's) go as soon as the search moves to bases off
    their path (:meth:`forget_bases_off`): no later candidate starts there, and a plan can then bound them.

    Args:
        dense_states: per calibration batch, ``{boundary: state}`` of the dense reference pass.
        boundaries: the cached dense boundaries, sorted (always including 0).
        num_blocks: N.
        capacity: how many other nodes may be kept (each holds one state per batch).
    """

    def __init__(
        self,
        dense_states: list[dict[int, torch.Tensor]],
        boundaries: list[int],
        num_blocks: int,
        capacity: int,
    ):
        self.dense_states = dense_states
        self.boundaries = boundaries
        self.num_blocks = num_blocks
        self.capacity = max(int(capacity), 0)
        self.nodes: OrderedDict[tuple[int, Prefix], list[torch.Tensor]] = OrderedDict()
        self._base_nodes: set[tuple[int, Prefix]] = set()
        self.bytes_held = 0
        """Bytes of the nodes held now (the dense ones not counted: they are the boundary cache)."""
        self.most_bytes_held = 0
        """The most :attr:`bytes_held` has been: what the nodes added to the evaluator's peak."""

    def start(self, removed: Prefix) -> tuple[int, list[torch.Tensor]]:
        """The deepest cached node on the path of ``removed``: its boundary and per-batch states."""
        first = removed[0] if removed else self.num_blocks
        dense = self.boundaries[bisect.bisect_right(self.boundaries, first) - 1]
        if self.nodes:
            for boundary in range(self.num_blocks - 1, dense, -1):
                key = (boundary, removed[: bisect.bisect_left(removed, boundary)])
                states = self.nodes.get(key)
                if states is not None:
                    self.nodes.move_to_end(key)
                    return boundary, states
        return dense, [states[dense] for states in self.dense_states]

    def remember(
        self, removed: Prefix, boundary: int, states: list[torch.Tensor], base: bool = False
    ) -> None:
        """Keep the per-batch ``states`` entering ``boundary`` on the path of ``removed`` (``base``: kept for
        a base a search extends, see :meth:`forget_bases_off`)."""
        if self.capacity == 0:
            return
        key = (boundary, removed[: bisect.bisect_left(removed, boundary)])
        self._forget(key)
        self.nodes[key] = states
        self.bytes_held += sum(state.nbytes for state in states)
        self.most_bytes_held = max(self.most_bytes_held, self.bytes_held)
        if base:
            self._base_nodes.add(key)
        while len(self.nodes) > self.capacity:
            self._forget(next(iter(self.nodes)))

    def forget_bases_off(self, bases: list[Prefix]) -> None:
        """Drop the nodes kept for earlier bases that lie on none of ``bases``' paths (each sorted)."""
        stale = [
            (boundary, prefix)
            for boundary, prefix in self._base_nodes
            if not any(base[: bisect.bisect_left(base, boundary)] == prefix for base in bases)
        ]
        for key in stale:
            self._forget(key)

    def _forget(self, key: tuple[int, Prefix]) -> None:
        states = self.nodes.pop(key, None)
        if states is not None:
            self.bytes_held -= sum(state.nbytes for state in states)
        self._base_nodes.discard(key)

    def clear(self) -> None:
        """Forget every node but the dense ones."""
        self.nodes.clear()
        self._base_nodes.clear()
        self.bytes_held = 0


def spaced(candidates: list[int], count: int) -> list[int]:
    """``count`` of the sorted ``candidates``, evenly spaced, the first one always included."""
    if count >= len(candidates):
        return list(candidates)
    if count <= 0:
        return []
    return sorted({candidates[(index * len(candidates)) // count] for index in range(count)})
