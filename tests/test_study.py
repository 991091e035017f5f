"""The study's statistics on hand-computed cases, and a tiny end-to-end study."""

from __future__ import annotations

import math

import pytest

from pruning.study_stats import (
    full_overlap,
    headline_comparison,
    inter_method_variance,
    jaccard,
    pairwise_jaccard,
    perplexity_accuracy_spearman,
    rank,
)


def test_jaccard_hand_computed():
    assert jaccard({1, 2, 3}, {2, 3, 4}) == pytest.approx(2 / 4)
    assert jaccard([0, 1], [2, 3]) == 0.0
    assert jaccard((5, 6), (6, 5)) == 1.0
    assert jaccard([], []) == 1.0


def test_pairwise_jaccard_mean_and_range():
    # pairs: {1,2}-{1,3}: 1/3; {1,2}-{1,2}: 1; {1,3}-{1,2}: 1/3
    summary = pairwise_jaccard([{1, 2}, {1, 3}, {1, 2}])
    assert summary.pairs == 3
    assert summary.mean == pytest.approx((1 / 3 + 1 + 1 / 3) / 3)
    assert summary.minimum == pytest.approx(1 / 3)
    assert summary.maximum == 1.0
    assert math.isnan(pairwise_jaccard([{1}]).mean)


def test_full_overlap():
    # ∩ = {2}, ∪ = {1, 2, 3, 4}
    assert full_overlap([{1, 2}, {2, 3}, {2, 4}]) == pytest.approx(1 / 4)
    assert full_overlap([{7, 8}, {8, 7}]) == 1.0
    assert full_overlap([{1}, {2}]) == 0.0


def test_inter_method_variance_is_population_variance():
    # mean 4, squared deviations 4, 0, 4 -> 8 / 3
    assert inter_method_variance([2.0, 4.0, 6.0]) == pytest.approx(8 / 3)
    assert inter_method_variance([3.0]) == 0.0
    assert inter_method_variance([1.0, float("nan"), 3.0]) == pytest.approx(1.0)


def test_rank_ties_and_direction():
    assert rank([10.0, 5.0, 5.0]) == [3.0, 1.5, 1.5]
    assert rank([0.1, 0.9, 0.5], descending=True) == [3.0, 1.0, 2.0]


def test_spearman_between_perplexity_rank_and_accuracy_rank():
    # perplexity orders the variants exactly as accuracy does -> +1
    assert perplexity_accuracy_spearman([10, 20, 30, 40], [0.8, 0.7, 0.6, 0.5]) == pytest.approx(1.0)
    # exactly reversed -> -1
    assert perplexity_accuracy_spearman([10, 20, 30, 40], [0.5, 0.6, 0.7, 0.8]) == pytest.approx(-1.0)
    # ranks (1,2,3,4) vs (2,1,4,3): d² = 1+1+1+1 = 4; ρ = 1 - 6·4/(4·15) = 0.6
    assert perplexity_accuracy_spearman([10, 20, 30, 40], [0.7, 0.8, 0.5, 0.6]) == pytest.approx(0.6)
    assert math.isnan(perplexity_accuracy_spearman([1, 2], [0.5, 0.6]))
    assert math.isnan(perplexity_accuracy_spearman([1, 2, 3], [0.5, 0.5, 0.5]))


def test_headline_comparison_separates_objectives_from_searches():
    masks = {
        ("perplexity", "greedy", 2): {0, 1},
        ("perplexity", "beam", 2): {0, 1},
        ("task_margin", "greedy", 2): {4, 5},
        ("task_margin", "beam", 2): {4, 6},
        # another budget: never compared with the masks above
        ("perplexity", "greedy", 3): {4, 5, 6},
    }
    headline = headline_comparison(masks)
    # same objective, different search: ppl 1.0, margin 1/3
    assert headline.search_pairs == 2
    assert headline.across_searches_same_objective == pytest.approx((1 + 1 / 3) / 2)
    # same search, different objective: greedy 0, beam 0
    assert headline.objective_pairs == 2
    assert headline.across_objectives_same_search == 0.0
    assert headline.calibration_matters_more is True
