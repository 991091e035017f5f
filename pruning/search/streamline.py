"""LLM-Streamline's layer selection (Chen et al., 2024): remove the contiguous run of M blocks whose input and
output hidden states are most alike.

score(s) = mean over calibration tokens of cos(input of block s, input of block s + M), the state before the
run and the state after it; the run [s, s + M) with the highest score is removed (the first maximum on a
tie). Only the selection: LLM-Streamline's replacement layer and its training are not part of it. Like
Block Influence it is a one-shot similarity criterion that never looks at the calibration loss while
choosing; it costs nothing beyond the evaluator's dense pass (``objective.block_input_similarity()``, where
score(s) = S[s, s + M]) and one score of the result.

It follows ``get_pruned_layer_streamline`` in LoRP's ``lib/layer_select.py`` (commit ff58fe1): the starts
scored are s = 1 .. N − M − ``latter_barrier`` (default 1), so block 0 is never removed and the barrier's last
blocks are kept; the state after the last block is never used. Deviations: the published list also holds a
never-scored 0.0 for s = 0, which would win only if every scored cosine were ≤ 0 (or, when no start is
allowed, remove blocks 0..M−1); here s = 0 is never chosen and no allowed start is a one-line error. S is
averaged per token over our calibration data and computed in float32, as described in :mod:`.lorp`.
Blocks protected by ``--protect`` are never in the run: starts whose run holds one are not scored (block 0
and the last block never are anyway).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ground.core.errors import UserError
from pruning.search import base
from pruning.search.lorp import similarity_matrix


@dataclass
class Options(base.SearchOptions):
    """Settings of LLM-Streamline's selection (the default is the published one)."""

    latter_barrier: int = base.integer(1)
    """How many last blocks can never be removed (at least 1: the output of block N−1 is not compared)."""


@base.define_search(Options, deterministic=True)
def search(
    objective: base.SubsetObjective, budget: int, settings: Options, seed: int, progress: bool
) -> base.SearchResult:
    """Remove the contiguous ``budget`` blocks whose boundary states (``block_input_similarity()``) are
    most similar. Seed and progress are unused (deterministic, one step).

    Returns:
        The removal set [s, s + M), its calibration loss, and every allowed start's score as history.

    Raises:
        UserError: a bad budget or option, or no allowed start (M > N − 1 − ``latter_barrier``).
    """
    num_blocks = objective.num_blocks
    protected = base.protected_blocks(objective)
    starts = [
        start
        for start in range(1, num_blocks - budget - settings.latter_barrier + 1)
        if protected.isdisjoint(range(start, start + budget))
    ]
    if not starts:
        extra = f" and blocks {sorted(protected)}" if protected else ""
        raise UserError(
            f"streamline cannot remove {budget} contiguous blocks of {num_blocks} keeping block 0, the "
            f"last {settings.latter_barrier}{extra}: choose M <= {num_blocks - 1 - settings.latter_barrier}"
            + (" and a run free of the protected blocks" if protected else "")
        )
    similarity = similarity_matrix(objective)
    scores = [float(similarity[start, start + budget]) for start in starts]
    best = starts[int(np.argmax(scores))]  # argmax: the first maximum, as list.index(max(...))
    removed = list(range(best, best + budget))
    history = [
        {"step": 0, "starts": list(starts), "boundary_similarity": scores, "start": best, "removed": removed}
    ]
    result = base.finish(objective, removed, history, settings)
    result.options.update(start=best, boundary_similarity=scores[starts.index(best)])
    return result
