"""ShortGPT's one-shot Block Influence: remove the M blocks that change their input least.

BI_i = 1 − mean over tokens of cos(h_in, h_out) on the calibration data (Men et al., 2024). It is the
"structural view" baseline: it never looks at the calibration loss while choosing, only to report the
chosen set's loss. Cost: one dense pass for the hidden states (done by the evaluator) plus one score.
Protected blocks (``--protect``) are never chosen.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pruning.search.base import (
    SearchResult,
    SubsetObjective,
    check_budget,
    finish,
    lowest,
    parse_options,
    protected_blocks,
)

DETERMINISTIC = True
"""Whether the result is the same under every seed (the single-block prior): the seed is ignored."""


@dataclass
class Options:
    """Block Influence has no settings (it is deterministic and ignores the seed)."""


def search(
    objective: SubsetObjective, budget: int, *, seed: int = 0, progress: bool = True, **options
) -> SearchResult:
    """Remove the ``budget`` blocks with the lowest Block Influence.

    Args:
        objective: provides ``block_influence()`` and scores the result.
        budget: M, the number of blocks to remove.
        seed: unused (deterministic).
        progress: unused.
        **options: none are accepted.

    Returns:
        The removal set, its calibration loss, the BI values as history.
    """
    settings = parse_options(Options, options, "block_influence")
    check_budget(objective, budget)
    influence = np.asarray(objective.block_influence(), dtype=np.float64)
    if influence.shape != (objective.num_blocks,):
        raise ValueError(
            f"block_influence() returned shape {influence.shape}, expected ({objective.num_blocks},)"
        )
    candidates = influence.copy()
    candidates[sorted(protected_blocks(objective))] = np.inf
    removed = lowest(candidates, budget)
    history = [{"step": 0, "block_influence": [float(value) for value in influence], "removed": removed}]
    return finish(objective, removed, history, settings)
