"""The arm order of the load test's rounds: a carry-over balanced (Williams) design (loadtest/order.py)."""

from __future__ import annotations

from collections import Counter

import pytest

from loadtest.order import balanced_block, block_rounds, predecessor_counts, round_order, williams_rows


@pytest.mark.parametrize("arms", range(1, 8))
def test_every_block_row_is_a_permutation_and_every_arm_holds_every_position_equally(arms):
    block = balanced_block(arms)
    assert len(block) == block_rounds(arms) == (arms if arms % 2 == 0 or arms == 1 else 2 * arms)
    for row in block:
        assert sorted(row) == list(range(arms))
    for position in range(arms):
        counts = Counter(row[position] for row in block)
        assert set(counts) == set(range(arms)) and len(set(counts.values())) == 1


@pytest.mark.parametrize("arms", range(2, 8))
def test_within_rounds_every_arm_follows_every_other_equally_often(arms):
    pairs = Counter((row[index], row[index + 1]) for row in williams_rows(arms) for index in range(arms - 1))
    expected = {(a, b) for a in range(arms) for b in range(arms) if a != b}
    assert set(pairs) == expected and len(set(pairs.values())) == 1


def test_three_arms_are_balanced_across_rounds_too():
    # dense, dense (A/A), variant: each arm follows each other arm 3 times per block, never itself (the
    # cyclic rotation let the A/A arm follow only the variant's engine).
    assert predecessor_counts(balanced_block(3), 3) == [[0, 3, 3], [3, 0, 3], [3, 3, 0]]


def test_four_arms_give_the_baseline_and_the_aa_arm_the_same_predecessors():
    counts = predecessor_counts(balanced_block(4), 4)
    assert counts[0] == counts[3] == [1, 1, 1, 1]


def test_two_arms_alternate_which_runs_first():
    assert [round_order(["dense", "v"], r) for r in range(4)] == [
        ["dense", "v"],
        ["v", "dense"],
        ["dense", "v"],
        ["v", "dense"],
    ]


def test_round_order_repeats_the_block():
    models = ["dense", "v", "dense (A/A)"]
    first = [round_order(models, r) for r in range(6)]
    assert [round_order(models, r) for r in range(6, 12)] == first
    assert len({tuple(order) for order in first}) == 6
