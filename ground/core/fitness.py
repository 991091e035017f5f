"""The quality gate: whether a pruned variant is fit to serve, from what ``prune`` measured on held-out data.

Ground layer (no torch), so that the pruning pipeline that measures and the server that refuses read one
rule. A variant is **unfit** when

* its held-out perplexity exceeds K x the dense model's (K = ``--max-ppl-ratio``, default
  :data:`DEFAULT_MAX_PPL_RATIO`), or
* its task accuracy on held-out multiple-choice items (multiple-choice objectives) is at or below chance
  (the mean of 1 / choices) while the dense model's is above it.
"""

from __future__ import annotations

DEFAULT_MAX_PPL_RATIO = 10.0
"""K: held-out perplexity above K x the dense model's makes a variant unfit."""


def fitness(
    perplexity: float,
    dense_perplexity: float,
    max_ppl_ratio: float = DEFAULT_MAX_PPL_RATIO,
    accuracy: float | None = None,
    dense_accuracy: float | None = None,
    chance: float | None = None,
) -> tuple[bool, list[str]]:
    """``(fit, reasons)``: the verdict and, for an unfit variant, why (one phrase per failed test)."""
    reasons = []
    if not perplexity <= max_ppl_ratio * dense_perplexity:  # a NaN perplexity is unfit too
        reasons.append(
            f"held-out perplexity {perplexity:.4g} > {max_ppl_ratio:g} x dense {dense_perplexity:.4g}"
        )
    if accuracy is not None and chance is not None and accuracy <= chance:
        if dense_accuracy is None or dense_accuracy > chance:
            reasons.append(f"task accuracy {accuracy:.3f} at or below chance {chance:.3f}")
    return not reasons, reasons
