"""The scoring engine: the exact, fast subset evaluator every search calls, ``score(removed) -> loss``.

* :mod:`.evaluator` — :class:`SubsetEvaluator`, the face searches see (scores, ranking queries, minibatch
  scores, the signals some searches need), over the collaborators below;
* :mod:`.build` — :func:`build_evaluator`: data, model and the dense reference pass;
* :mod:`.dense_pass` — where the boundary cache lives, and the dense reference pass that fills it;
* :mod:`.reference` — the KL reference (dense log-probabilities, or final hidden states);
* :mod:`.score_book` — the memo's values, the lower bounds of stopped sets, minibatch per-sample losses;
* :mod:`.trie_walk` — groups of sets scored batch by batch through the trie, from the deepest cached state;
* :mod:`.minibatch` — EvoPress's minibatch scores; :mod:`.gradients` — CBO's residual gradients;
* :mod:`.runner` — block and LM-head calls, every one counted;
* :mod:`.shortcuts` — the exact shortcuts: cached boundaries, shared prefixes (a trie), lower bounds;
* :mod:`.fusion` — the blocks through one compiled forward on CUDA (``fused_blocks``, off by default);
* :mod:`.packing` — how batches are laid out for the blocks (a question's choices packed);
* :mod:`.memo` — the memo on disk (JSON file and append-only journal);
* :mod:`.statistics` — work counters (:class:`EvaluatorStats`) and the block-input similarity;
* :mod:`.bench` — the naive-comparison bench (:func:`compare_with_naive`).
"""

from ground.core.lazy import lazy_exports

_EXPORTS = {
    "SubsetEvaluator": "pruning.calibration.scoring.evaluator",
    "build_evaluator": "pruning.calibration.scoring.build",
    "EvaluatorStats": "pruning.calibration.scoring.statistics",
    "compare_with_naive": "pruning.calibration.scoring.bench",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
