"""How a heavy job runs: its memory plan before any weight loads, its engine, and its own process.

* :mod:`.plans` — the memory plan of ``prune``, ``study``, ``heal`` and ``eval`` (``--dry-run``, the sizes
  chosen, refusing what cannot fit); the planner itself is :mod:`ground.planning`;
* :mod:`.engine_choice` — ``auto`` → vLLM or torch, decided without loading either;
* :mod:`.isolation` — one GPU job per process, an out-of-memory told apart as a permanent failure.

Stands on :mod:`pruning.model`; evaluation, the pipeline, healing and the study stand on it.
"""

from ground.core.lazy import lazy_exports

_EXPORTS = {
    "PlanRequest": "pruning.runtime.plans",
    "resolve_engine": "pruning.runtime.engine_choice",
    "run_in_own_process": "pruning.runtime.isolation",
    "OutOfMemory": "pruning.runtime.isolation",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
