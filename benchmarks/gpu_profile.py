"""Where one exact subset evaluation spends its time (issue 44 item 4), for ``benchmarks.gpu_scale``.

Removing block ``k`` alone makes the evaluator resume at cached boundary ``k`` and run the ``N - k - 1``
blocks after it, then the LM head and the loss. Timing fresh single-block removals at several ``k`` and
fitting ``seconds = fixed + per_block x blocks run`` splits an evaluation into the blocks (the slope) and the
head, loss and bookkeeping (the intercept), through the public scoring API only; the block's achieved TFLOP/s
from the slope is the ceiling a search on this evaluator can reach. ``torch.profiler`` over one more
evaluation names the operators (device time first on CUDA).
"""

from __future__ import annotations

import time

import numpy as np

PROFILED_ROWS = 25
"""Operators kept in the profiler's table."""


def synchronised_seconds(device: str, work) -> float:
    """Wall seconds of ``work()`` with the device's queue drained before and after."""
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()
    start = time.perf_counter()
    work()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - start


def removal_points(num_blocks: int) -> list[int]:
    """Blocks removed one at a time: spread from the first (most blocks run after it) to the last (none),
    leaving two blocks for the warm-up and the profiled evaluation."""
    return sorted({round(value) for value in np.linspace(0, num_blocks - 1, min(6, num_blocks - 2))})


def profile_evaluation(evaluator, device: str, block_flops: float) -> tuple[dict, str]:
    """The split of one evaluation into blocks and the rest, and the profiler's operator table.

    ``block_flops`` is one block call's FLOPs over the evaluator's calibration tokens. Every set timed is new
    to the evaluator (never a memo hit); the first call warms the kernels and is not counted.
    """
    import torch

    blocks = evaluator.num_blocks
    points = removal_points(blocks)
    warm_up = next(k for k in range(blocks) if k not in points)
    evaluator.score({warm_up})
    timings = [
        (blocks - k - 1, synchronised_seconds(device, lambda k=k: evaluator.score({k}))) for k in points
    ]
    run, seconds = np.array(timings, dtype=float).T
    per_block, fixed = np.polyfit(run, seconds, 1)
    profiled = next(k for k in range(blocks) if k not in points and k != warm_up)
    activities = [torch.profiler.ProfilerActivity.CPU]
    sort_by = "self_cpu_time_total"
    if device.startswith("cuda"):
        activities.append(torch.profiler.ProfilerActivity.CUDA)
        sort_by = "self_device_time_total"
    with torch.profiler.profile(activities=activities) as profiler:
        evaluator.score({profiled})
        if device.startswith("cuda"):
            torch.cuda.synchronize()
    table = profiler.key_averages().table(sort_by=sort_by, row_limit=PROFILED_ROWS)
    longest = seconds[np.argmax(run)]
    return {
        "removed_one_at_a_time": points,
        "blocks_run": [int(value) for value in run],
        "seconds": [round(float(value), 4) for value in seconds],
        "per_block_seconds": round(float(per_block), 5),
        "fixed_seconds": round(float(fixed), 4),
        "block_tflops": float(f"{block_flops / 1e12 / max(per_block, 1e-12):.4g}"),
        "blocks_fraction_of_longest": round(float(per_block * run.max() / longest), 3),
        "profiled_removal": profiled,
    }, f"one evaluation with block {profiled} removed ({blocks - profiled - 1} blocks run)\n{table}"
