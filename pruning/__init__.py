"""Depth pruning: calibration, subset scoring, searches, pruned checkpoints, evaluation and the study.

Sub-packages by job:

* :mod:`pruning.calibration` — data sources, objectives, packing and the exact subset scorer;
* :mod:`pruning.search` — one file per search algorithm, listed in ``SEARCHES``;
* :mod:`pruning.evaluation` — perplexity suites and zero-shot accuracy through lm-eval, on vLLM or torch;
* :mod:`pruning.study` — the study grid, its statistics, report and figures;
* :mod:`pruning.healing` — recover a pruned variant's quality with LoRA or distillation.

At the top: :mod:`pruning.models` (block access per architecture), :mod:`pruning.checkpoint` (mask → HF
checkpoint), :mod:`pruning.prune` (the ``prune`` pipeline) and :mod:`pruning.cli` (its commands). Names are
resolved on first use, so ``import pruning`` does not import torch.
"""

from depthprune.core.lazy import lazy_exports

_EXPORTS = {
    "prune": "pruning.prune",
    "PruneConfig": "pruning.prune",
    "CalibrationConfig": "pruning.calibration.config",
    "OBJECTIVES": "pruning.calibration.objectives",
    "SubsetEvaluator": "pruning.calibration.scoring.evaluator",
    "build_evaluator": "pruning.calibration.scoring.build",
    "SEARCHES": "pruning.search",
    "BlockStack": "pruning.models",
    "load_model": "pruning.models",
    "write_pruned_checkpoint": "pruning.checkpoint",
    "PrunedCheckpoint": "pruning.checkpoint",
    "VariantRecord": "registry.records",
    "EvalSettings": "pruning.evaluation.suites",
    "evaluate_variants": "pruning.evaluation.suites",
    "HealConfig": "pruning.healing.config",
    "heal": "pruning.healing.heal",
    "StudyConfig": "pruning.study.plan",
    "run_study": "pruning.study.run",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
