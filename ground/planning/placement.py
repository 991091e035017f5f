"""Which GPU holds which decoder block when a model is spread over several (a ``device_map``).

A model larger than one card is split into contiguous runs of blocks, one run per card, with the embedding
on the first card and the final norm and LM head on the last (a tied head stays with the embedding, whose
weight it shares). The runs are chosen to make the most loaded card as light as possible, so the planner's
weights estimate and the real placement are the same numbers. Loading (:mod:`pruning.model.placement`) turns
the assignment into the ``device_map`` transformers and accelerate take; nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from ground.planning.parameters import ParameterCount


@dataclass(frozen=True)
class BlockPlacement:
    """Card of every block, and of the parts around them, for ``devices`` cards."""

    block_devices: tuple[int, ...]
    """``block_devices[i]`` is the card (0-based among the cards used) of block ``i``."""
    embedding_device: int
    """Card of the input embedding (and of whatever the decoder holds besides its blocks)."""
    head_device: int
    """Card of the final norm and LM head."""
    device_parameters: tuple[int, ...]
    """Parameters on each card."""

    @property
    def devices(self) -> int:
        """Cards used."""
        return len(self.device_parameters)


def _loads(count: ParameterCount, cuts: list[int], devices: int, tied: bool) -> list[int]:
    """Parameters per card when card ``d`` holds blocks ``cuts[d]:cuts[d + 1]``."""
    loads = [sum(count.blocks[cuts[d] : cuts[d + 1]]) for d in range(devices)]
    loads[0] += count.embedding + count.extra
    loads[0 if tied else devices - 1] += count.head
    return loads


def _greedy_cuts(count: ParameterCount, devices: int, tied: bool, limit: int) -> list[int] | None:
    """Fill each card up to ``limit`` parameters, block by block; None when the blocks do not fit."""
    blocks = count.blocks
    cuts, load, card = [0], count.embedding + count.extra + (count.head if tied else 0), 0
    for index, size in enumerate(blocks):
        if load + size > limit and index > cuts[-1]:
            card += 1
            cuts.append(index)
            load = 0
        load += size
        if load > limit or card >= devices:
            return None
    cuts += [len(blocks)] * (devices + 1 - len(cuts))
    # The head goes on the last card: it must fit beside that card's blocks.
    return cuts if tied or max(_loads(count, cuts, devices, tied)) <= limit else None


def place_blocks(count: ParameterCount, devices: int, tied: bool) -> BlockPlacement:
    """Contiguous runs of blocks on ``devices`` cards that make the most loaded card as light as possible.

    Args:
        count: the model's parameters by part (:func:`~ground.planning.parameters.count_parameters`).
        devices: cards to spread over (at least 1; more cards than blocks leaves the rest empty).
        tied: the LM head shares the embedding's weight (it then stays on the first card).

    Returns:
        The placement; every block is on exactly one card.
    """
    devices = max(1, min(devices, len(count.blocks)))
    total = count.total
    low, high = max(max(count.blocks), 1), total
    best = [0] + [len(count.blocks)] * devices
    while low <= high:  # binary search on the heaviest card's load
        middle = (low + high) // 2
        cuts = _greedy_cuts(count, devices, tied, middle)
        if cuts is None:
            low = middle + 1
        else:
            best, high = cuts, middle - 1
    block_devices = tuple(d for d in range(devices) for _ in range(best[d], best[d + 1]))
    return BlockPlacement(
        block_devices=block_devices,
        embedding_device=0,
        head_device=0 if tied else devices - 1,
        device_parameters=tuple(_loads(count, best, devices, tied)),
    )
