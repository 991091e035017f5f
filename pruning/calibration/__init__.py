"""Calibration: what a pruned model is scored on, and the exact subset scorer every search calls.

* :mod:`~pruning.calibration.data` — data sources (``SOURCES``: ``c4``, ``commonsense170k``, ``pydoc``,
  ``text:PATH``, ...), spec strings, the seeded sample draw, ``data show``;
* :mod:`~pruning.calibration.objectives` — one loss module per objective of
  :data:`ground.core.objectives.OBJECTIVES` (perplexity, KL, task margin), and the batches they score;
* :mod:`~pruning.calibration.config` — :class:`CalibrationConfig`, what the registry stores;
* :mod:`~pruning.calibration.scoring` — :class:`SubsetEvaluator`, ``score(removed_blocks) -> loss``, its
  shortcuts, memo, packing, statistics and the naive-comparison bench.
"""

from ground.core.lazy import lazy_exports

_EXPORTS = {
    "DataSpec": "pruning.calibration.data.items",
    "parse_spec": "pruning.calibration.data.specs",
    "load_samples": "pruning.calibration.data.sampling",
    "load_documents": "pruning.calibration.data.specs",
    "load_choice_items": "pruning.calibration.data.specs",
    "CalibrationConfig": "pruning.calibration.config",
    "OBJECTIVES": "pruning.calibration.objectives",
    "get_objective": "pruning.calibration.objectives",
    "loss_of": "pruning.calibration.objectives",
    "make_batches": "pruning.calibration.objectives.batches",
    "SubsetEvaluator": "pruning.calibration.scoring.evaluator",
    "build_evaluator": "pruning.calibration.scoring.build",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
