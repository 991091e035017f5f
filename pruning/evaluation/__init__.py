"""Evaluation of dense and pruned variants: perplexity suites and zero-shot accuracy through lm-eval.

* :mod:`~pruning.evaluation.suites` — the suites (WikiText-2 / C4 / LAMBADA perplexity, lm-eval zero-shot,
  the demo model's own, ``offline``: pydoc perplexity and pydoc-cloze accuracy), run on variants and recorded
  in the registry;
* :mod:`~pruning.evaluation.engines` — the two scoring engines (vLLM, torch) behind one interface;
* :mod:`~pruning.evaluation.lm_eval_models` — lm-eval ``LM`` adapters over those engines;
* :mod:`~pruning.evaluation.user_suites` — the user's own files as suites (``text:PATH``, ``mc:PATH``);
* :mod:`~pruning.evaluation.intervals`, :mod:`~pruning.evaluation.item_scores`,
  :mod:`~pruning.evaluation.paired` — 95 % intervals, per-item scores, the paired comparison against the
  baseline (docs/evaluation.md, "Quality: intervals and pairing"); :mod:`~pruning.evaluation.report` — the
  tables;
* ``tasks/`` — lm-eval task YAMLs of the project (the demo QA task, the pydoc cloze task).
"""

from ground.core.lazy import lazy_exports

_EXPORTS = {
    "EvalSettings": "pruning.evaluation.suites",
    "EvalResult": "pruning.evaluation.results",
    "ComparedModel": "pruning.evaluation.paired",
    "paired_comparison": "pruning.evaluation.paired",
    "recorded_comparison": "pruning.evaluation.paired",
    "evaluate_variants": "pruning.evaluation.suites",
    "evaluate_model": "pruning.evaluation.suites",
    "SUITES": "pruning.evaluation.suites",
    "open_engine": "pruning.evaluation.engines",
    "TorchEngine": "pruning.evaluation.engines",
    "VllmEngine": "pruning.evaluation.engines",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
