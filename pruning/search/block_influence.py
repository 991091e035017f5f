"""ShortGPT's one-shot Block Influence: remove the M blocks that change their input least.

BI_i = 1 − mean over tokens of cos(h_in, h_out) on the calibration data (Men et al., 2024). It is the
"structural view" baseline: it never looks at the calibration loss while choosing, only to report the
chosen set's loss. Cost: one dense pass for the hidden states (done by the evaluator) plus one score.
Protected blocks (``--protect``) are never chosen.
"""

from __future__ import annotations

import numpy as np

from pruning.search import base


@base.define_search(deterministic=True)
def search(
    objective: base.SubsetObjective, budget: int, settings: base.SearchOptions, seed: int, progress: bool
) -> base.SearchResult:
    """Remove the ``budget`` blocks with the lowest Block Influence (``objective.block_influence()``).

    Seed and progress are unused (deterministic, one step).

    Returns:
        The removal set, its calibration loss, the BI values as history.
    """
    influence = np.asarray(objective.block_influence(), dtype=np.float64)
    if influence.shape != (objective.num_blocks,):
        raise ValueError(
            f"block_influence() returned shape {influence.shape}, expected ({objective.num_blocks},)"
        )
    candidates = influence.copy()
    candidates[sorted(base.protected_blocks(objective))] = np.inf
    removed = base.lowest(candidates, budget)
    history = [{"step": 0, "block_influence": [float(value) for value in influence], "removed": removed}]
    return base.finish(objective, removed, history, settings)
