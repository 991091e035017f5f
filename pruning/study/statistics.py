"""The study's statistics as small pure functions: mask overlap, spread across methods, rank agreement.

Everything here works on plain Python values (removal sets, lists of floats) so that it can be checked by
hand: ``tests/test_study.py`` does exactly that. :mod:`pruning.study.report` turns the numbers into tables.

Conventions (also stated in the report):

* Jaccard similarity of two removal sets is ``|A ∩ B| / |A ∪ B|`` (1 for two empty sets).
* Full overlap of a family of sets is ``|∩ S| / |∪ S|``: 1 only when every method removed the same blocks.
* Inter-method variance σ² is the population variance (``ddof=0``) of one metric across the searches of a
  cell, as the study reports it: it describes these methods, not a sample of a larger population.
* Rank agreement is Spearman's ρ between the perplexity ranking (lowest perplexity = rank 1) and the
  accuracy ranking (highest accuracy = rank 1), so ρ = +1 means perplexity orders the variants exactly as
  accuracy does.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations


def jaccard(first: Iterable[int], second: Iterable[int]) -> float:
    """Jaccard similarity ``|A ∩ B| / |A ∪ B|`` of two removal sets; two empty sets count as identical."""
    a, b = set(first), set(second)
    union = a | b
    if not union:
        return 1.0
    return len(a & b) / len(union)


@dataclass(frozen=True)
class PairwiseJaccard:
    """Summary of the Jaccard similarity over every pair of a family of removal sets."""

    mean: float
    """Mean over all unordered pairs."""
    minimum: float
    """Smallest pairwise similarity."""
    maximum: float
    """Largest pairwise similarity."""
    pairs: int
    """Number of unordered pairs summarised."""


def pairwise_jaccard(masks: Sequence[Iterable[int]]) -> PairwiseJaccard:
    """Mean and range of the Jaccard similarity over all unordered pairs of ``masks``.

    Args:
        masks: two or more removal sets.

    Returns:
        The summary; NaN fields when fewer than two masks are given.
    """
    sets = [set(mask) for mask in masks]
    values = [jaccard(a, b) for a, b in combinations(sets, 2)]
    if not values:
        return PairwiseJaccard(math.nan, math.nan, math.nan, 0)
    return PairwiseJaccard(sum(values) / len(values), min(values), max(values), len(values))


def full_overlap(masks: Sequence[Iterable[int]]) -> float:
    """``|∩ S| / |∪ S|`` over a family of removal sets (NaN for no sets, 1 when the union is empty)."""
    sets = [set(mask) for mask in masks]
    if not sets:
        return math.nan
    union = set().union(*sets)
    if not union:
        return 1.0
    return len(set.intersection(*sets)) / len(union)


def inter_method_variance(values: Sequence[float]) -> float:
    """Population variance σ² (``ddof=0``) of one metric across methods; NaN values are ignored."""
    finite = [float(value) for value in values if value is not None and not math.isnan(value)]
    if not finite:
        return math.nan
    mean = sum(finite) / len(finite)
    return sum((value - mean) ** 2 for value in finite) / len(finite)


def rank(values: Sequence[float], *, descending: bool = False) -> list[float]:
    """Ranks starting at 1 (ties share their mean rank), smallest first unless ``descending``."""
    from scipy.stats import rankdata

    keyed = [-float(value) for value in values] if descending else [float(value) for value in values]
    return [float(r) for r in rankdata(keyed, method="average")]


def perplexity_accuracy_spearman(perplexities: Sequence[float], accuracies: Sequence[float]) -> float:
    """Spearman ρ between the perplexity ranking (low = best) and the accuracy ranking (high = best).

    Args:
        perplexities: one perplexity per variant.
        accuracies: the same variants' accuracies, in the same order.

    Returns:
        ρ in [-1, 1]; +1 when perplexity orders the variants as accuracy does. NaN with fewer than three
        variants or when either ranking is constant (ρ is undefined then).
    """
    if len(perplexities) != len(accuracies):
        raise ValueError("perplexities and accuracies must have the same length")
    pairs = [
        (p, a) for p, a in zip(perplexities, accuracies, strict=True) if not (math.isnan(p) or math.isnan(a))
    ]
    if len(pairs) < 3 or len({p for p, _ in pairs}) < 2 or len({a for _, a in pairs}) < 2:
        return math.nan
    from scipy.stats import spearmanr

    ppl_rank = rank([p for p, _ in pairs])
    acc_rank = rank([a for _, a in pairs], descending=True)
    return float(spearmanr(ppl_rank, acc_rank).statistic)


@dataclass(frozen=True)
class HeadlineComparison:
    """The study's claim in numbers: do masks differ more across objectives or across searches?"""

    across_searches_same_objective: float
    """Mean Jaccard between masks of different searches under the same objective (same budget, seed, data)."""
    across_objectives_same_search: float
    """Mean Jaccard between masks of different objectives under the same search (same budget, seed, data)."""
    search_pairs: int
    """Number of mask pairs behind the first mean."""
    objective_pairs: int
    """Number of mask pairs behind the second mean."""

    @property
    def calibration_matters_more(self) -> bool | None:
        """True when masks agree more across searches than across objectives (the study's finding)."""
        if math.isnan(self.across_searches_same_objective) or math.isnan(self.across_objectives_same_search):
            return None
        return self.across_searches_same_objective > self.across_objectives_same_search


def headline_comparison(masks: Mapping[tuple, Iterable[int]]) -> HeadlineComparison:
    """Compare mask agreement across searches (calibration fixed) with agreement across calibrations.

    Args:
        masks: ``(calibration, search, *context) -> removal set``, where calibration names the objective (and
            data, when it varies); ``context`` (budget, seed, ...) must match for two masks to be compared, so
            budgets are never mixed.

    Returns:
        Both mean Jaccard similarities with their pair counts (NaN mean when no pair exists).
    """
    items = [(key[0], key[1], tuple(key[2:]), set(mask)) for key, mask in masks.items()]
    across_searches: list[float] = []
    across_objectives: list[float] = []
    for (obj_a, search_a, ctx_a, mask_a), (obj_b, search_b, ctx_b, mask_b) in combinations(items, 2):
        if ctx_a != ctx_b:
            continue
        if obj_a == obj_b and search_a != search_b:
            across_searches.append(jaccard(mask_a, mask_b))
        elif search_a == search_b and obj_a != obj_b:
            across_objectives.append(jaccard(mask_a, mask_b))

    def mean(values: list[float]) -> float:
        return sum(values) / len(values) if values else math.nan

    return HeadlineComparison(
        mean(across_searches), mean(across_objectives), len(across_searches), len(across_objectives)
    )
