"""What one evaluation measures: :class:`EvalResult`, and which accuracy metric a task reports.

Kept apart from :mod:`pruning.evaluation.suites` (which runs the suites) so that the statistics
(:mod:`pruning.evaluation.paired`) read results without importing the runner; ``suites`` re-exports both.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

PRIMARY_METRICS = {
    "hellaswag": "acc_norm",
    "arc_easy": "acc_norm",
    "arc_challenge": "acc_norm",
    "piqa": "acc_norm",
    "winogrande": "acc",
    "boolq": "acc",
    "demo_qa": "acc_norm",
    "pydoc_cloze": "acc_norm",
}
"""Task -> the accuracy the study reports: lm-eval's ``acc_norm`` where the task defines it, else ``acc``.

That rule gives the paper's choice for its six tasks (its dense HellaSwag 79.3 is ``acc_norm``; WinoGrande
and BoolQ define only ``acc``), and it is applied unchanged to the project's own tasks: ``demo_qa`` and
``pydoc_cloze`` define both, so they report ``acc_norm``."""


@dataclass
class EvalResult:
    """One number: a metric of one task of one suite."""

    suite: str
    """``perplexity``, ``zero-shot``, ``demo``, ``offline``, or ``user`` (a ``text:`` / ``mc:`` file)."""
    task: str
    """Task name (``wikitext2``, ``arc_easy``, ``demo_qa``, ...)."""
    metric: str
    """``perplexity``, ``acc`` or ``acc_norm``."""
    value: float
    """The metric's value."""
    settings: dict = field(default_factory=dict)
    """How it was measured (engine, sequence length, windows, tokens, stderr, limit, versions), and under
    ``statistics`` what was measured: ``n``, the 95 % interval, the per-item scores and the comparison with
    a baseline (:mod:`pruning.evaluation.item_scores`, :mod:`pruning.evaluation.paired`)."""


def primary_metric(task: str, measured: Sequence[str] = ()) -> str:
    """The accuracy metric reported for ``task``: :data:`PRIMARY_METRICS`, else ``acc_norm`` when it was
    measured (``measured`` lists the metrics there are), else ``acc``."""
    if task in PRIMARY_METRICS:
        return PRIMARY_METRICS[task]
    return "acc_norm" if "acc_norm" in measured else "acc"
