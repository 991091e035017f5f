"""The naive-comparison bench: the fast evaluator against a full forward per candidate (SLEB's way).

``depthprune prune --benchmark`` (:func:`compare_with_naive`): the same workload — every single-block
removal, then random M-block sets (:func:`benchmark_sets`) — scored by both, their wall times, block-forward
and token counts, and the largest score difference (they must agree to the tolerance).
"""

from __future__ import annotations

import random
from dataclasses import asdict

import numpy as np
import torch
from tqdm.auto import tqdm

from ground.core.errors import UserError
from pruning.calibration.config import CalibrationConfig
from pruning.calibration.scoring.build import build_evaluator
from pruning.calibration.scoring.evaluator import SubsetEvaluator
from pruning.model.blocks import load_config


def check_budget(budget: int, num_blocks: int) -> None:
    """A removal budget M must leave at least one of the N blocks: 1 <= M < N."""
    if not isinstance(budget, int) or not 0 < budget < num_blocks:
        raise UserError(
            f"budget M={budget} must be between 1 and {num_blocks - 1}: the model has {num_blocks} blocks"
        )


def benchmark_sets(
    num_blocks: int, budget: int = 4, random_sets: int = 100, seed: int = 0
) -> list[frozenset[int]]:
    """The benchmark workload: every single-block removal, then ``random_sets`` random M-block sets."""
    check_budget(budget, num_blocks)
    if random_sets < 0:
        raise UserError(f"the number of random sets must be >= 0, got {random_sets}")
    rng = random.Random(seed)
    singles = [frozenset({index}) for index in range(num_blocks)]
    return singles + [frozenset(rng.sample(range(num_blocks), budget)) for _ in range(random_sets)]


def _score_workload(
    model: str,
    config: CalibrationConfig,
    side: str,
    round_label: str,
    workload: dict,
    build_options: dict,
) -> tuple[SubsetEvaluator, list[frozenset[int]], np.ndarray]:
    """One benchmark round of one side (``fast`` or ``naive``) from a freshly built evaluator.

    Args:
        model: hub id or local directory.
        config: the calibration configuration.
        side: ``fast`` or ``naive``.
        round_label: ``"i/n"`` for the progress bar.
        workload: ``budget``, ``random_sets`` and ``seed`` of :func:`benchmark_sets`, and the fast side's
            ``memory_budget_gb``.
        build_options: the other keyword arguments of :func:`build_evaluator`.

    Returns:
        The evaluator (its stats hold the round's cost), the removal sets and their scores.
    """
    naive = side == "naive"
    evaluator = build_evaluator(
        model,
        config,
        naive=naive,
        memory_budget_gb=None if naive else workload["memory_budget_gb"],
        **build_options,
    )
    sets = benchmark_sets(evaluator.num_blocks, workload["budget"], workload["random_sets"], workload["seed"])
    scored = [
        evaluator.score(removed)
        for removed in tqdm(
            sets,
            desc=f"{side} scoring ({round_label})",
            unit="set",
            disable=not build_options["progress"],
        )
    ]
    return evaluator, sets, np.array(scored)


def _comparison_record(
    model: str,
    config: CalibrationConfig,
    evaluators: dict[str, SubsetEvaluator],
    sets: list[frozenset[int]],
    seconds: dict[str, list[float]],
    difference: float,
    settings: dict,
) -> dict:
    """The JSON-ready result of :func:`compare_with_naive` from the last evaluator of each side."""
    fast, naive = evaluators["fast"], evaluators["naive"]
    fast_seconds, naive_seconds = float(np.median(seconds["fast"])), float(np.median(seconds["naive"]))
    return {
        "model": str(model),
        "calibration": asdict(config),
        "num_blocks": fast.num_blocks,
        "sets": len(sets),
        "distinct_sets": len(set(sets)),
        "budget": settings["budget"],
        "sequences": sum(batch.input_ids.shape[0] for batch in fast.batches),
        "packed_sequences": sum(run.input_ids.shape[0] for run in fast.run_batches),
        "packed": fast.packed,
        "batch_size": settings["batch_size"],
        "dtype": settings["dtype"],
        "device": str(fast.device),
        "threads": torch.get_num_threads(),
        "cached_boundaries": fast.boundaries,
        "repeats": settings["repeats"],
        "fast_seconds": round(fast_seconds, 3),
        "fast_reference_pass_seconds": round(fast.stats.reference_seconds, 3),
        "naive_seconds": round(naive_seconds, 3),
        "speedup": round(naive_seconds / fast_seconds, 3) if fast_seconds else None,
        "fast_seconds_each": [round(value, 3) for value in seconds["fast"]],
        "naive_seconds_each": [round(value, 3) for value in seconds["naive"]],
        "fast_block_forwards": fast.stats.block_forwards,
        "naive_block_forwards": naive.stats.block_forwards,
        "fast_tokens": fast.stats.tokens,
        "naive_tokens": naive.stats.tokens,
        "fast_head_positions": fast.stats.head_positions,
        "naive_head_positions": naive.stats.head_positions,
        "fast_memo_hits": fast.stats.memo_hits,
        "max_abs_difference": difference,
        "tolerance": settings["tolerance"],
        "agree": difference <= settings["tolerance"],
        "fast_stats": asdict(fast.stats),
        "naive_stats": asdict(naive.stats),
    }


def compare_with_naive(
    model: str,
    config: CalibrationConfig,
    *,
    budget: int = 4,
    random_sets: int = 100,
    seed: int = 0,
    batch_size: int = 16,
    dtype: str = "float32",
    device: str = "cpu",
    memory_budget_gb: float | None = None,
    tolerance: float = 1e-5,
    progress: bool = True,
    repeats: int = 1,
    pack_choices: bool = True,
) -> dict:
    """Score the benchmark workload with the fast evaluator and with naive full forwards.

    The fast side's time includes its dense reference pass (the price of the cache); model loading is
    excluded from both. With ``repeats`` > 1 both sides run that many times, interleaved (fast, naive, then
    naive, fast, ...: drift of a shared machine hits both), each time from a freshly built evaluator (empty
    memo, its own reference pass); times are the medians and ``speedup`` their ratio.

    Returns:
        One JSON-ready dict: wall times, block-forward and token counts, ``speedup``, ``agree`` and the
        largest score difference.
    """
    benchmark_sets(load_config(model).num_hidden_layers, budget, random_sets, seed)  # bad input: fail early
    if not isinstance(repeats, int) or repeats < 1:
        raise UserError(f"repeats must be a positive integer, got {repeats!r}")
    workload = {
        "budget": budget,
        "random_sets": random_sets,
        "seed": seed,
        "memory_budget_gb": memory_budget_gb,
    }
    build_options = {
        "dtype": dtype,
        "device": device,
        "progress": progress,
        "batch_size": batch_size,
        "pack_choices": pack_choices,
    }
    seconds: dict[str, list[float]] = {"fast": [], "naive": []}
    scores: dict[str, np.ndarray] = {}
    evaluators: dict[str, SubsetEvaluator] = {}
    difference = 0.0
    for repeat in range(repeats):
        for side in ("fast", "naive") if repeat % 2 == 0 else ("naive", "fast"):
            evaluator, sets, scored = _score_workload(
                model, config, side, f"{repeat + 1}/{repeats}", workload, build_options
            )
            if side in scores:  # every repeat must give the very same scores
                difference = max(difference, float(np.max(np.abs(scored - scores[side]))))
            scores[side] = scored
            seconds[side].append(evaluator.stats.wall_seconds + evaluator.stats.reference_seconds)
            evaluators[side] = evaluator
    difference = max(difference, float(np.max(np.abs(scores["fast"] - scores["naive"]))))
    settings = {
        "budget": budget,
        "batch_size": batch_size,
        "dtype": dtype,
        "repeats": repeats,
        "tolerance": tolerance,
    }
    return _comparison_record(model, config, evaluators, sets, seconds, difference, settings)
