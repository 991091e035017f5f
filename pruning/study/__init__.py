"""The study: every (calibration, budget, search, seed) cell pruned, evaluated and reported.

* :mod:`~pruning.study.grid` — plan and run the grid (``depthprune study``);
* :mod:`~pruning.study.statistics` — Jaccard overlaps, inter-method variance, Spearman ρ;
* :mod:`~pruning.study.report` — the tables and figures (Markdown, HTML, PNG).
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
