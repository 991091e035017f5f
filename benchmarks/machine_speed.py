"""How fast this machine is right now, as one JSON line: 2-thread float32 matmul GFLOP/s, the load average
and the CPU, so a wall time can be read beside the speed of the machine that made it
(``benchmarks/demo_repeats.sh`` writes it before and after each ``make demo`` run; issue 57 quoted 219 GFLOP/s
for a fast day).

Run: ``.venv/bin/python -m benchmarks.machine_speed``
"""

from __future__ import annotations

import json
import os
import time

MATMUL_SIZE = 1024
"""Side of the square float32 matrices multiplied: 2.1 GFLOP a product, a few milliseconds each."""
THREADS = 2
"""torch threads: the 2 cores the demo's engines and searches share."""


def matmul_gflops(seconds: float = 2.0) -> float:
    """Best-of float32 matmul throughput with :data:`THREADS` threads over about ``seconds``, in GFLOP/s."""
    import torch

    torch.set_num_threads(THREADS)
    left, right = torch.randn(MATMUL_SIZE, MATMUL_SIZE), torch.randn(MATMUL_SIZE, MATMUL_SIZE)
    left @ right  # warm-up: thread pool and caches
    best, ended = float("inf"), time.perf_counter() + seconds
    while time.perf_counter() < ended:
        started = time.perf_counter()
        left @ right
        best = min(best, time.perf_counter() - started)
    return 2 * MATMUL_SIZE**3 / best / 1e9


def main() -> None:
    """Print ``{"matmul_gflops", "threads", "load_1m", "load_5m", "cpus", "cpu"}`` as one JSON line."""
    from ground.planning.devices import cpu_model

    load_1m, load_5m, _ = os.getloadavg()
    speed = {
        "matmul_gflops": round(matmul_gflops(), 1),
        "threads": THREADS,
        "load_1m": round(load_1m, 2),
        "load_5m": round(load_5m, 2),
        "cpus": os.cpu_count(),
        "cpu": cpu_model(),
    }
    print(json.dumps(speed))


if __name__ == "__main__":
    main()
