"""The study: every (calibration, budget, search, seed) cell pruned, evaluated and reported.

* :mod:`~pruning.study.plan` — the grid of cells, checked before any weights load;
* :mod:`~pruning.study.cells` — the cells pruned and evaluated, the manifest;
* :mod:`~pruning.study.run` — ``depthprune study`` from plan to report;
* :mod:`~pruning.study.statistics` — Jaccard overlaps, inter-method variance, Spearman ρ;
* :mod:`~pruning.study.tables` — one function per table of the report;
* :mod:`~pruning.study.figures` — one function per figure (PNG);
* :mod:`~pruning.study.report` — the report itself (Markdown, HTML);
* :mod:`~pruning.study.reading` — the reading, generated from ``study.json`` (like-for-like with the paper);
* :mod:`~pruning.study.cross_reading` — its cross-controls part (one search under two configurations);
* :mod:`~pruning.study.reading_basis` — what both stand on (the paper's facts and budgets, cell provenance);
* :mod:`~pruning.study.healing` — ``study --heal``: each distinct mask healed once, before/after sections;
* :mod:`~pruning.study.worker` — ``study --worker``: cells claimed from the registry's work queue.
"""

from ground.core.lazy import lazy_exports

_EXPORTS = {
    "StudyConfig": "pruning.study.plan",
    "heal_study": "pruning.study.healing",
    "parse_heal_option": "pruning.study.plan",
    "run_worker": "pruning.study.worker",
    "plan_study": "pruning.study.plan",
    "run_study": "pruning.study.run",
    "write_report": "pruning.study.report",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
