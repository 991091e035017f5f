"""Speculative decoding's acceptance read two ways, and Leviathan et al.'s projection from the right one.

vLLM counts drafts (verification steps), draft tokens (K per step) and accepted tokens. Its *acceptance
rate* is accepted / drafted tokens, and its *mean accepted length* is 1 + accepted / drafts = 1 + K · rate
(the bonus token included). Leviathan et al. (2023) model each drafted token as accepted with probability α
independently until the first rejection, so a step emits on average

    E[accepted + 1] = (1 − α^(K+1)) / (1 − α)

tokens, and decoding speeds up by that over (K · c + 1), c the draft's cost per token over the target's. The
per-token α is therefore the α for which that expectation equals the measured mean accepted length
(:func:`token_alpha`); the rate is not α (rate 0.39 at K = 3 is α ≈ 0.60), and a projection must use α, or
the measured length directly (:func:`projected_speedup`).
"""

from __future__ import annotations

import math


def accepted_length(alpha: float, k: int) -> float:
    """E[accepted + 1] per verification step at per-token acceptance ``alpha`` and ``k`` drafted tokens."""
    if alpha >= 1:
        return float(k + 1)
    return (1 - alpha ** (k + 1)) / (1 - alpha)


def token_alpha(mean_accepted_length: float, k: int) -> float:
    """The per-token α whose :func:`accepted_length` is ``mean_accepted_length`` (0 at 1 token, 1 at K + 1).

    Args:
        mean_accepted_length: tokens per verification step, the bonus token included (vLLM's).
        k: tokens drafted per step.

    Returns:
        α in [0, 1] (bisection to 1e-12; the expectation rises with α).
    """
    if not math.isfinite(mean_accepted_length) or k < 1:
        raise ValueError(f"need a finite mean accepted length and K >= 1, got {mean_accepted_length}, {k}")
    if mean_accepted_length <= 1:
        return 0.0
    if mean_accepted_length >= k + 1:
        return 1.0
    low, high = 0.0, 1.0
    while high - low > 1e-12:
        middle = (low + high) / 2
        low, high = (middle, high) if accepted_length(middle, k) < mean_accepted_length else (low, middle)
    return (low + high) / 2


def rate_from_length(mean_accepted_length: float, k: int) -> float:
    """vLLM's acceptance rate (accepted / drafted tokens) from its mean accepted length: (L − 1) / K."""
    return (mean_accepted_length - 1) / k


def projected_speedup(alpha: float, k: int, cost: float) -> float:
    """Leviathan et al.'s expected speed-up: E[accepted + 1] / (K · c + 1), α per token."""
    return accepted_length(alpha, k) / (k * cost + 1)


def alpha_for_speedup(speedup: float, k: int, cost: float) -> float:
    """The per-token α a draft of cost ``cost`` needs for ``speedup`` at ``k`` (1.0 when out of reach)."""
    return token_alpha(speedup * (k * cost + 1), k)
