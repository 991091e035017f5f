"""The order the arms run in, round by round: a carry-over balanced (Williams) design.

Why not a rotation: on the 2-core machine a run that follows a run on *another* vLLM engine waits about 1 s
longer for its first token than one that follows the same engine (docs/benchmarks.md, "Carry-over"). With
the arms ``dense, dense (A/A), variant`` rotated cyclically, the A/A arm always follows the variant's engine
and dense never does, so the A/A ratio came out biased low (0.90-0.98) although the weights are identical.

A Williams design (Williams 1949, the cross-over trials' standard) fixes that: over one *block* of rounds
every arm runs in every position equally often and follows every other arm equally often. For an even
number of arms one block is ``n`` rounds (a Williams Latin square); for an odd number it is ``2n`` (the square
and its mirror image): 2 rounds for 2 arms, 6 for 3, 4 for 4. The block's rows are then ordered so that the
transitions *between* rounds (the last arm of a round before the first of the next, cyclically) are as
balanced as they can be too: exactly so for 2 and 3 arms (3 arms: every arm preceded by each other arm three
times per block, never by itself). For 4 arms no ordering is exact; the one chosen gives the first arm (the
baseline) and the last (the A/A arm, which ``loadtest`` adds after the targets) identical predecessors.

Stopping rules end a measurement only after a whole block (:mod:`loadtest.precision`), so the balance holds.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from functools import cache

EXHAUSTIVE_ROW_ORDERS = 8
"""Blocks of at most this many rows have every ordering of their rows tried (7! = 5,040); longer blocks keep
the square's own order (their between-round transitions are then balanced only as the square makes them)."""


def williams_rows(arms: int) -> list[tuple[int, ...]]:
    """The rows of a Williams design for ``arms`` arms (``arms`` rows if even or 1, ``2 * arms`` if odd).

    The first row is ``0, 1, n-1, 2, n-2, ...``; row ``i`` adds ``i`` to it modulo ``n``. Within the rows
    every ordered pair of different arms is adjacent equally often; for odd ``n`` only with the mirror rows.
    """
    if arms < 1:
        raise ValueError(f"a design needs at least one arm, got {arms}")
    first, low, high = [0], 1, arms - 1
    while len(first) < arms:
        first.append(low)
        low += 1
        if len(first) < arms:
            first.append(high)
            high -= 1
    rows = [tuple((arm + shift) % arms for arm in first) for shift in range(arms)]
    if arms % 2 and arms > 1:
        rows += [tuple(reversed(row)) for row in rows]
    return rows


def predecessor_counts(rows: Sequence[Sequence[int]], arms: int) -> list[list[int]]:
    """``counts[b][a]``: how often arm ``b`` runs right after arm ``a`` when the rows repeat end to end."""
    counts = [[0] * arms for _ in range(arms)]
    sequence = [arm for row in rows for arm in row]
    for previous, current in zip(sequence[-1:] + sequence[:-1], sequence, strict=True):
        counts[current][previous] += 1
    return counts


def imbalance(rows: Sequence[Sequence[int]], arms: int) -> int:
    """How far the repeated rows are from every arm having the same predecessors: 0 is perfect balance.

    The spread (max - min) of each arm's counts over the *other* arms, summed, plus the spread of how often
    an arm follows itself across arms.
    """
    counts = predecessor_counts(rows, arms)
    spread = 0
    for current in range(arms):
        others = [counts[current][previous] for previous in range(arms) if previous != current]
        spread += max(others, default=0) - min(others, default=0)
    selves = [counts[arm][arm] for arm in range(arms)]
    return spread + max(selves) - min(selves)


@cache
def balanced_block(arms: int) -> tuple[tuple[int, ...], ...]:
    """One block of rounds: Williams rows, ordered for the most balanced transitions between rounds."""
    rows = williams_rows(arms)
    if len(rows) <= EXHAUSTIVE_ROW_ORDERS:
        # The first row stays first (the order is cyclic); ties keep the earliest ordering found.
        orderings = ([rows[0], *rest] for rest in itertools.permutations(rows[1:]))
        rows = min(orderings, key=lambda candidate: imbalance(candidate, arms))
    return tuple(rows)


def block_rounds(arms: int) -> int:
    """Rounds in one balanced block for ``arms`` arms."""
    return len(balanced_block(arms))


def round_order(models: Sequence[str], round_index: int) -> list[str]:
    """The arms of round ``round_index`` in the order they run (row ``round_index`` of the repeated block)."""
    block = balanced_block(len(models))
    return [models[arm] for arm in block[round_index % len(block)]]
