"""LoRP, Locality-Aware Redundancy Pruning (Yun et al., 2026, arXiv:2605.27786), as its official code does it.

A one-shot similarity criterion: it never looks at the calibration loss while choosing, only to report the
chosen set's loss. It follows ``get_pruned_layer_lorp`` and ``_capture_sim_and_cluster`` in
``lib/layer_select.py`` of ``daniel-eai/LoRP-Locality-Aware-Redundancy-Pruning`` (commit ff58fe1):

1. S[i, j] = mean over tokens of the cosine between the inputs of blocks i and j (each token's state
   L2-normalised), unit diagonal: ``objective.block_input_similarity()``, from the evaluator's dense pass.
2. RLS = −log2(mean of S over i < j); K = 2 if RLS ≥ 1.0, 3 if RLS ≥ 0.7, else 4 (``num_clusters``
   overrides; 0 or None means the rule, as ``if num_clusters`` does there).
3. scikit-learn's ``SpectralClustering(n_clusters=K, affinity="precomputed", random_state=seed,
   assign_labels="kmeans")`` on (S + 1) / 2 with a unit diagonal (the seed is LoRP's ``random_state``, whose
   default 0 is our default seed); cluster ids re-indexed by the depth of their first block.
4. Blocks 0 and N−1 are protected (``protect_first`` / ``protect_last``): never candidates, but still members
   of their clusters for every mean below. Blocks protected by ``--protect`` (the objective's ``protected``)
   are added to them.
5. In each cluster the eligible blocks are ranked once, by their mean similarity to the other members of the
   full cluster (highest first; a stable sort, so ties go to the lower block index).
6. Stage 1: the top block of each cluster, clusters in depth order, while the budget lasts.
7. Stage 2: until M blocks are removed, the cluster whose remaining (not removed, protected included) members
   have the highest mean pairwise similarity gives up its next ranked block; ties go to the lower cluster id,
   exhausted clusters are skipped, and when no cluster has two remaining members the first cluster with a
   candidate left gives one.

Cost: nothing beyond the evaluator's dense reference pass (S is computed there) and one score of the result.
The result's ``options`` record RLS, the off-diagonal mean, K, the cluster labels, the rankings and S itself,
so they reach ``pruning.json`` and the registry.

Deviations from the published code, none of which changes the selection on LoRP's own setting:

* S is the mean over every real calibration token (weighted as Block Influence is: padding left out, a shared
  prompt token once per choice), where LoRP averages per batch of one 2048-token window and then over
  batches. For text windows, all of one length, the two are equal; for multiple-choice data a longer
  sequence weighs more here.
* The states are normalised in float32 (LoRP in float16) and S accumulated in float64, then made exactly
  symmetric; the model runs in the evaluator's dtype (float32 by default; LoRP float16).
* The calibration data are ours (the ``CalibrationConfig``), not LoRP's 128 C4 windows of 2048 tokens.
* When M exceeds the eligible blocks LoRP silently removes fewer; here it is a one-line error.
* A K from the RLS rule larger than N is lowered to N (scikit-learn cannot make more clusters than blocks);
  a ``num_clusters`` larger than N is an error. A non-finite RLS (off-diagonal mean ≤ 0) gives K = 4, as the
  published comparisons do for NaN, and is recorded as ``None``.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np

from ground.core.errors import UserError
from pruning.search import base


@dataclass
class Options(base.SearchOptions):
    """Settings of LoRP (its defaults are the published ones)."""

    num_clusters: int | None = base.integer(None, minimum=0, optional=True)
    """K, the number of spectral clusters; None (or 0) = the RLS rule (2, 3 or 4)."""
    protect_first: bool = base.flag(True)
    """Never remove block 0."""
    protect_last: bool = base.flag(True)
    """Never remove block N−1."""


def similarity_matrix(objective: base.SubsetObjective) -> np.ndarray:
    """The objective's ``[N, N]`` block-input similarity, checked, as float64 with LoRP's unit diagonal."""
    similarity = np.array(objective.block_input_similarity(), dtype=np.float64)
    num_blocks = objective.num_blocks
    if similarity.shape != (num_blocks, num_blocks):
        raise ValueError(
            f"block_input_similarity() returned shape {similarity.shape}, "
            f"expected ({num_blocks}, {num_blocks})"
        )
    if not np.isfinite(similarity).all():
        raise ValueError("block_input_similarity() returned a non-finite value")
    np.fill_diagonal(similarity, 1.0)
    return similarity


def representation_locality(similarity: np.ndarray) -> tuple[float, float]:
    """LoRP eqs. 5-6: the mean of S over i < j, and RLS = −log2 of it (NaN when the mean is ≤ 0)."""
    off_diagonal = float(similarity[np.triu_indices(len(similarity), k=1)].mean())
    with np.errstate(divide="ignore", invalid="ignore"):
        rls = float(-np.log2(off_diagonal))
    return off_diagonal, rls


def clusters_for_locality(rls: float) -> int:
    """LoRP's RLS-guided granularity: K = 2 (RLS ≥ 1.0, localized), 3 (RLS ≥ 0.7), else 4 (distributed)."""
    if rls >= 1.0:
        return 2
    if rls >= 0.7:
        return 3
    return 4


def spectral_clusters(similarity: np.ndarray, clusters: int, seed: int) -> list[int]:
    """Spectral clustering of the affinity (S + 1) / 2 (LoRP eq. 7), ids re-indexed by depth.

    Args:
        similarity: ``[N, N]`` S.
        clusters: K.
        seed: scikit-learn's ``random_state`` (arpack's start vector and the k-means restarts).

    Returns:
        Per block its cluster id; cluster 0 holds block 0, cluster 1 the first block not in 0, and so on.
    """
    from sklearn.cluster import SpectralClustering

    affinity = (similarity + 1.0) / 2.0
    np.fill_diagonal(affinity, 1.0)
    clustering = SpectralClustering(
        n_clusters=clusters, affinity="precomputed", random_state=seed, assign_labels="kmeans"
    )
    with warnings.catch_warnings():
        # With K close to N scikit-learn notes that it uses a dense eigensolver instead of arpack.
        warnings.filterwarnings("ignore", message="k >= N")
        raw_labels = clustering.fit_predict(affinity)
    depth_order: dict[int, int] = {}
    for label in raw_labels:
        depth_order.setdefault(int(label), len(depth_order))
    return [depth_order[int(label)] for label in raw_labels]


def cluster_members(labels: list[int], clusters: int) -> dict[int, list[int]]:
    """Per cluster id ``0..clusters-1`` its blocks, ascending (an id may have none)."""
    return {
        cluster: [block for block, label in enumerate(labels) if label == cluster]
        for cluster in range(clusters)
    }


def member_redundancy(similarity: np.ndarray, block: int, members: list[int]) -> float:
    """LoRP eq. 8: the mean similarity of ``block`` to the other members (−inf when it is alone)."""
    others = [member for member in members if member != block]
    if not others:
        return -math.inf
    return float(np.mean([similarity[block, member] for member in others]))


def residual_redundancy(similarity: np.ndarray, remaining: list[int]) -> float:
    """LoRP eq. 10: the mean pairwise similarity of the remaining members (−inf below two)."""
    if len(remaining) < 2:
        return -math.inf
    pairs = [
        similarity[first, second]
        for index, first in enumerate(remaining)
        for second in remaining[index + 1 :]
    ]
    return float(sum(pairs) / len(pairs))


def ranked_candidates(
    similarity: np.ndarray, members: dict[int, list[int]], protected: set[int]
) -> dict[int, list[int]]:
    """Per cluster, its unprotected blocks by member redundancy, highest first (ties: lower block)."""
    return {
        cluster: sorted(
            (block for block in blocks if block not in protected),
            key=lambda block, blocks=blocks: -member_redundancy(similarity, block, blocks),
        )
        for cluster, blocks in members.items()
    }


def allocate(
    similarity: np.ndarray, labels: list[int], clusters: int, budget: int, protected: set[int]
) -> tuple[list[int], list[dict]]:
    """LoRP's two-stage redundancy-aware allocation.

    Args:
        similarity: ``[N, N]`` S.
        labels: per block its (depth-ordered) cluster id in ``0..clusters-1``.
        clusters: K (a cluster id may have no member).
        budget: M.
        protected: blocks never removed.

    Returns:
        The removed blocks in the order chosen, and one history entry per choice.
    """
    members = cluster_members(labels, clusters)
    candidates = ranked_candidates(similarity, members, protected)
    taken = dict.fromkeys(candidates, 0)
    removed: list[int] = []
    history: list[dict] = []

    def take(cluster: int, stage: int, residual: float | None) -> None:
        block = candidates[cluster][taken[cluster]]
        taken[cluster] += 1
        removed.append(block)
        history.append(
            {"step": len(history), "stage": stage, "cluster": cluster, "block": block, "residual": residual}
        )

    for cluster in sorted(candidates):  # stage 1: coverage, shallow clusters first
        if len(removed) >= budget:
            break
        if taken[cluster] < len(candidates[cluster]):
            take(cluster, 1, None)
    while len(removed) < budget:  # stage 2: the cluster with the most residual redundancy
        best_cluster, best_mean = None, -math.inf
        for cluster, blocks in members.items():
            if taken[cluster] >= len(candidates[cluster]):
                continue
            mean = residual_redundancy(similarity, [block for block in blocks if block not in removed])
            if mean > best_mean:
                best_cluster, best_mean = cluster, mean
        if best_cluster is None:  # no open cluster has two members left: the first open one
            best_cluster = next((c for c in sorted(candidates) if taken[c] < len(candidates[c])), None)
            if best_cluster is None:
                break
        take(best_cluster, 2, None if best_mean == -math.inf else best_mean)
    return removed, history


def finite_or_none(value: float) -> float | None:
    """JSON-safe: a finite float, else None."""
    return float(value) if math.isfinite(value) else None


@base.define_search(Options, deterministic=False)
def search(
    objective: base.SubsetObjective, budget: int, settings: Options, seed: int, progress: bool
) -> base.SearchResult:
    """Remove ``budget`` blocks by LoRP's locality-aware clustering (of ``block_input_similarity()``) and
    two-stage allocation. The seed is the spectral clustering's ``random_state``; no progress bar.

    Returns:
        The removal set, its calibration loss, one history entry per block chosen (stage, cluster, the
        residual redundancy that won stage 2); ``options`` also holds RLS, K, the labels and S.

    Raises:
        UserError: a bad budget or option, fewer eligible blocks than M, or more clusters than blocks.
    """
    num_blocks = objective.num_blocks
    protected = (
        ({0} if settings.protect_first else set())
        | ({num_blocks - 1} if settings.protect_last else set())
        | set(base.protected_blocks(objective))
    )
    if num_blocks - len(protected) < budget:
        raise UserError(
            f"lorp cannot remove {budget} of {num_blocks} blocks with blocks {sorted(protected)} protected: "
            f"choose M <= {num_blocks - len(protected)}"
        )
    if settings.num_clusters and settings.num_clusters > num_blocks:
        raise UserError(f"lorp cannot make {settings.num_clusters} clusters of {num_blocks} blocks")
    similarity = similarity_matrix(objective)
    off_diagonal, rls = representation_locality(similarity)
    clusters = settings.num_clusters or min(clusters_for_locality(rls), num_blocks)
    labels = spectral_clusters(similarity, clusters, seed)
    chosen, history = allocate(similarity, labels, clusters, budget, protected)
    members = cluster_members(labels, clusters)
    score = np.mean([member_redundancy(similarity, block, members[labels[block]]) for block in chosen])
    result = base.finish(objective, chosen, history, settings)
    result.options.update(
        rls=finite_or_none(rls),
        off_diagonal_similarity=off_diagonal,
        cluster_count=clusters,
        cluster_labels=labels,
        cluster_rankings=[
            ranked for _, ranked in sorted(ranked_candidates(similarity, members, protected).items())
        ],
        mean_member_redundancy=finite_or_none(float(score)),
        block_input_similarity=similarity.tolist(),
    )
    return result
