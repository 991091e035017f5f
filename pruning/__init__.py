"""Depth pruning: calibration, subset scoring, searches, pruned checkpoints, evaluation and the study.

Sub-packages by job, as rooms with one-way doors (each imports only those listed after it; import-linter
keeps it so):

* :mod:`pruning.cli` — the commands (``prune``, ``checkpoint``, ``eval``, ``heal``, ``study``, ``data show``);
* :mod:`pruning.study` — the study grid, its statistics, report and figures;
* :mod:`pruning.pipeline` — the ``prune`` pipeline and its held-out choice;
  :mod:`pruning.healing` — recover a pruned variant's quality with LoRA or distillation;
  :mod:`pruning.evaluation` — perplexity suites and zero-shot accuracy through lm-eval, on vLLM or torch;
* :mod:`pruning.runtime` — memory plans, the engine choice, one GPU job per process;
  :mod:`pruning.calibration` — data sources, objectives, packing and the exact subset scorer;
  :mod:`pruning.search` — one file per search algorithm, listed in ``SEARCHES``;
* :mod:`pruning.model` — model sources, block access, pruned checkpoints.

Names are resolved on first use, so ``import pruning`` does not import torch.
"""

from ground.core.lazy import lazy_exports

_EXPORTS = {
    "prune": "pruning.pipeline.prune",
    "PruneConfig": "pruning.pipeline.prune",
    "CalibrationConfig": "pruning.calibration.config",
    "OBJECTIVES": "pruning.calibration.objectives",
    "SubsetEvaluator": "pruning.calibration.scoring.evaluator",
    "build_evaluator": "pruning.calibration.scoring.build",
    "SEARCHES": "pruning.search",
    "BlockStack": "pruning.model.blocks",
    "load_model": "pruning.model.blocks",
    "write_pruned_checkpoint": "pruning.model.checkpoint",
    "PrunedCheckpoint": "pruning.model.checkpoint",
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
