"""Request arrival times: all at once, a Poisson process, or a gamma process of chosen burstiness.

The process is the one ``vllm bench serve`` uses, so the two tools put the same load on a server:
inter-arrival gaps are drawn from Gamma(shape=burstiness, scale=1/(rate*burstiness)), whose mean is
1/rate and whose coefficient of variation is 1/sqrt(burstiness) (burstiness 1 = Poisson; below 1
burstier, above 1 more even; infinite = a fixed gap). Like vLLM, the cumulative offsets are rescaled
so the last request is sent at exactly ``num_requests / rate`` seconds, which keeps throughput
comparable between seeds.
"""

from __future__ import annotations

import math

import numpy as np


def arrival_offsets(num_requests: int, rate: float, burstiness: float = 1.0, seed: int = 0) -> list[float]:
    """Seconds after the start at which each request is sent.

    Args:
        num_requests: How many requests (at least 1).
        rate: Mean requests per second; ``math.inf`` sends every request at time 0.
        burstiness: Gamma shape factor (> 0); 1 is a Poisson process, ``math.inf`` a constant gap.
        seed: Seed of the random gaps, so every model of a comparison sees the same schedule.

    Returns:
        Non-decreasing offsets in seconds, one per request.
    """
    if num_requests < 1:
        raise ValueError("num_requests must be at least 1")
    if not rate > 0:
        raise ValueError("rate must be positive (math.inf for all at once)")
    if not burstiness > 0:
        raise ValueError("burstiness must be positive")
    if math.isinf(rate):
        return [0.0] * num_requests
    if math.isinf(burstiness):
        gaps = np.full(num_requests, 1.0 / rate)
    else:
        rng = np.random.default_rng(seed)
        gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=num_requests)
    offsets = np.cumsum(gaps)
    # Same normalisation as vLLM: the sum of gamma gaps misses n/rate by a few percent otherwise.
    offsets *= (num_requests / rate) / offsets[-1]
    return [float(value) for value in offsets]
