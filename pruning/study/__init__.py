"""The study: every (calibration, budget, search, seed) cell pruned, evaluated and reported.

* :mod:`~pruning.study.grid` — plan and run the grid (``depthprune study``);
* :mod:`~pruning.study.statistics` — Jaccard overlaps, inter-method variance, Spearman ρ;
* :mod:`~pruning.study.tables` — one function per table of the report;
* :mod:`~pruning.study.figures` — one function per figure (PNG);
* :mod:`~pruning.study.report` — the report itself (Markdown, HTML).
"""

from depthprune.lazy import lazy_exports

_EXPORTS = {
    "StudyConfig": "pruning.study.grid",
    "plan_study": "pruning.study.grid",
    "run_study": "pruning.study.grid",
    "write_report": "pruning.study.report",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
