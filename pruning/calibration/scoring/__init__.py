"""The scoring engine: the exact, fast subset evaluator every search calls, ``score(removed) -> loss``.

* :mod:`.evaluator` — :class:`SubsetEvaluator` (boundary cache, ranking queries, minibatch scores, the
  signals some searches need);
* :mod:`.build` — :func:`build_evaluator`: data, model and the dense reference pass;
* :mod:`.shortcuts` — the exact shortcuts: cached boundaries, shared prefixes (a trie), lower bounds;
* :mod:`.fusion` — the blocks through one compiled forward on CUDA (``fused_blocks``, off by default);
* :mod:`.packing` — how batches are laid out for the blocks (a question's choices packed);
* :mod:`.memo` — the memo on disk (JSON file and append-only journal);
* :mod:`.statistics` — work counters (:class:`EvaluatorStats`) and the block-input similarity;
* :mod:`.bench` — the naive-comparison bench (:func:`compare_with_naive`).
"""

from depthprune.core.lazy import lazy_exports

_EXPORTS = {
    "SubsetEvaluator": "pruning.calibration.scoring.evaluator",
    "build_evaluator": "pruning.calibration.scoring.build",
    "EvaluatorStats": "pruning.calibration.scoring.statistics",
    "compare_with_naive": "pruning.calibration.scoring.bench",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
