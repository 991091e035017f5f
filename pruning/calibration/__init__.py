"""Calibration: what a pruned model is scored on, and the exact subset scorer every search calls.

* :mod:`~pruning.calibration.data` — data specs (``c4``, ``commonsense170k``, ``text:PATH``, ...)
  resolved to text samples or multiple-choice items;
* :mod:`~pruning.calibration.offline_sources` — real English offline: CPython's documentation topics and cloze
  items built from them (``pydoc``, ``pydoc-cloze``);
* :mod:`~pruning.calibration.objectives` — ``OBJECTIVES`` (perplexity, KL, task margin) and the
  :class:`CalibrationConfig` the registry stores;
* :mod:`~pruning.calibration.packing` — how batches are laid out for the blocks (choices packed);
* :mod:`~pruning.calibration.scorer` — :class:`SubsetEvaluator`, ``score(removed_blocks) -> loss``.
"""

from depthprune.lazy import lazy_exports

_EXPORTS = {
    "DataSpec": "pruning.calibration.data",
    "parse_spec": "pruning.calibration.data",
    "load_samples": "pruning.calibration.data",
    "load_documents": "pruning.calibration.data",
    "load_choice_items": "pruning.calibration.data",
    "CalibrationConfig": "pruning.calibration.objectives",
    "OBJECTIVES": "pruning.calibration.objectives",
    "get_objective": "pruning.calibration.objectives",
    "make_batches": "pruning.calibration.objectives",
    "SubsetEvaluator": "pruning.calibration.scorer",
    "build_evaluator": "pruning.calibration.scorer",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
