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
* Accuracy movement (the paper's §5.2) is the absolute accuracy difference |a − b| of two variants that
  differ in the calibration configuration only (same search, budget, seed), against two that differ in
  the search only (same configuration, budget, seed): mean and largest over all such pairs.
* Pooled Jaccard aggregates the pairwise similarities of several families (cells) over all their pairs.
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


def pooled_pairwise_jaccard(families: Sequence[Sequence[Iterable[int]]]) -> PairwiseJaccard:
    """Pairwise Jaccard over every pair *within* each family (cell), pooled: mean and range over all pairs.

    Args:
        families: removal sets grouped by cell (pairs across cells are never formed).

    Returns:
        The summary over all within-family pairs; NaN fields when there is none.
    """
    values = [jaccard(a, b) for masks in families for a, b in combinations([set(m) for m in masks], 2)]
    if not values:
        return PairwiseJaccard(math.nan, math.nan, math.nan, 0)
    return PairwiseJaccard(sum(values) / len(values), min(values), max(values), len(values))


@dataclass(frozen=True)
class AccuracyMovement:
    """How far accuracy moves when the configuration changes vs when the search changes (§5.2)."""

    across_configurations_mean: float
    """Mean |Δ accuracy| between variants of different configurations under the same search."""
    across_configurations_max: float
    """Largest such |Δ|."""
    configuration_pairs: int
    """Pairs behind it."""
    across_searches_mean: float
    """Mean |Δ accuracy| between variants of different searches under the same configuration."""
    across_searches_max: float
    """Largest such |Δ| (per configuration, the spread of the searches)."""
    search_pairs: int
    """Pairs behind it."""


def accuracy_movement(accuracies: Mapping[tuple, float]) -> AccuracyMovement:
    """|Δ accuracy| across configurations (search fixed) and across searches (configuration fixed).

    Args:
        accuracies: ``(configuration, search, *context) -> accuracy``; two variants are compared only when
            their ``context`` (budget, seed, ...) is the same. NaN accuracies are left out.

    Returns:
        Mean and largest |Δ| on each side, with their pair counts (NaN when a side has no pair).
    """
    items = [
        (key[0], key[1], tuple(key[2:]), value) for key, value in accuracies.items() if not math.isnan(value)
    ]
    across_configurations: list[float] = []
    across_searches: list[float] = []
    for (config_a, search_a, ctx_a, acc_a), (config_b, search_b, ctx_b, acc_b) in combinations(items, 2):
        if ctx_a != ctx_b:
            continue
        if search_a == search_b and config_a != config_b:
            across_configurations.append(abs(acc_a - acc_b))
        elif config_a == config_b and search_a != search_b:
            across_searches.append(abs(acc_a - acc_b))

    def mean_max(values: list[float]) -> tuple[float, float]:
        return (sum(values) / len(values), max(values)) if values else (math.nan, math.nan)

    return AccuracyMovement(
        *mean_max(across_configurations),
        len(across_configurations),
        *mean_max(across_searches),
        len(across_searches),
    )
