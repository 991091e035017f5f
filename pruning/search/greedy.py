"""SLEB's greedy iterative elimination (Song et al., 2024).

Start from the dense model; at each of M steps, try removing each remaining block on top of the blocks
already removed and keep the one whose removal gives the lowest calibration loss. Cost:
N + (N−1) + ... + (N−M+1) subset evaluations; the first step is exactly the single-block prior, so on a
shared evaluator it is free once the prior exists. Deterministic (ties go to the lower block index).
Optimal when the objective is additive; otherwise it can be trapped by an early choice.

A step needs only the argmin, so it is a ranking query (:func:`~pruning.search.base.rank_lowest`, the
current set as the base): the evaluator runs each candidate from its new block on, and may stop scoring
a candidate whose loss is bound to exceed the best so far; such candidates are listed under ``stopped``
in the step's history with their lower bound instead of under ``candidates``.
"""

from __future__ import annotations

from tqdm.auto import tqdm

from pruning.search import base


@base.define_search(deterministic=True)
def search(
    objective: base.SubsetObjective, budget: int, settings: base.SearchOptions, seed: int, progress: bool
) -> base.SearchResult:
    """Remove blocks one at a time, each time the one that hurts the calibration loss least.

    The seed is unused (deterministic); the progress bar counts candidate evaluations.

    Returns:
        The removal set, its loss, and per step the chosen block and the candidates' losses.
    """
    num_blocks = objective.num_blocks
    total = sum(num_blocks - step for step in range(budget))
    removed: list[int] = []
    history: list[dict] = []
    with tqdm(total=total, desc="greedy", disable=not progress, leave=False) as bar:
        for step in range(budget):
            blocks = [block for block in range(num_blocks) if block not in removed]
            extended = [base.as_key([*removed, block]) for block in blocks]
            ranked = base.rank_lowest(objective, extended, keep=1, bases=[base.as_key(removed)])
            bar.update(len(blocks))
            candidates = {block: answer.loss for block, answer in zip(blocks, ranked) if answer.exact}
            chosen = min(candidates, key=lambda block: (candidates[block], block))
            removed.append(chosen)
            entry = {
                "step": step,
                "chosen": chosen,
                "loss": candidates[chosen],
                "candidates": {str(block): loss for block, loss in candidates.items()},
            }
            stopped = {str(block): answer.loss for block, answer in zip(blocks, ranked) if not answer.exact}
            if stopped:
                entry["stopped"] = stopped
            history.append(entry)
    return base.finish(objective, removed, history, settings)
