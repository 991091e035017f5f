"""What every part of a study's reading stands on: the paper's facts and budgets, the paper's seven
searches, how a cell names its configuration and calibration draw, and what a set of cells records (data
seeds, reused cells, truncated items). :mod:`pruning.study.reading` and :mod:`pruning.study.cross_reading`
both read these."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence

from pruning.study.paper import PAPER, PaperFacts, paper_budgets
from pruning.study.tables import average_perplexity, mean_accuracy, short_data

STUDY_SEARCHES = ("one_shot", "greedy", "beam", "genetic", "bayesian", "cbo", "fast_block_select")
"""The paper's seven (as :data:`pruning.search.STUDY_SEARCHES`; kept here so reading needs no torch)."""


def data_seed(cell: dict) -> int | None:
    """The cell's calibration draw: its ``data_seed``, else the key's calibration-seed field (older cells)."""
    if cell.get("data_seed") is not None:
        return int(cell["data_seed"])
    fields = str(cell.get("key", "")).split("|")
    return int(fields[4]) if len(fields) > 4 and fields[4].isdigit() else None


def configuration(cell: dict) -> str:
    """``objective on data`` (paths shortened to their file name)."""
    return f"{cell['objective']} on {short_data(cell['data'])}"


def provenance_facts(cells: Sequence[dict]) -> dict:
    """Data seeds (recorded or read from keys), reused cells, truncated items (recorded or not) of ``cells``
    (a study.json's cells)."""
    recorded = all("data_seed" in c and c["data_seed"] is not None for c in cells)
    seeds_by_seed = defaultdict(set)
    for cell in cells:
        seeds_by_seed[cell["seed"]].add(data_seed(cell))
    draws = sorted({s for found in seeds_by_seed.values() for s in found if s is not None})
    return {
        "data_seed_recorded": recorded,
        "data_seeds": draws,
        "draw_varies_with_seed": len(draws) > 1,
        "seeds": sorted(seeds_by_seed),
        "reused": sum(1 for c in cells if c.get("reused_from")),
        "truncation_recorded": all("truncated_items" in c for c in cells),
        "truncated_items": sum(int(c.get("truncated_items") or 0) for c in cells),
    }


def budget_label(facts: dict, drop) -> str:
    """``M = 8 (≈ the paper's 9)`` or ``M = 10 (extension)``."""
    paper = next((b["paper"] for b in facts["budgets"] if b["drop"] == drop), None)
    return f"M = {drop} (≈ the paper's {paper})" if paper else f"M = {drop} (extension)"


class Cells:
    """The study.json cells of the single-block prior, with the quality numbers the reading uses."""

    def __init__(self, study: dict, paper: PaperFacts = PAPER):
        self.study = study
        self.all = study["cells"]
        self.main = [c for c in self.all if c["prior"] == "single_block"]
        self.avg_tasks = study.get("average_perplexity_tasks") or []
        self.acc_metrics = study.get("accuracy_metrics") or {}
        self.num_blocks = study["summary"]["num_blocks"]
        self.mapping = paper_budgets(self.num_blocks, paper)
        self.drops = sorted({c["drop"] for c in self.main})
        self.like = [m for m in self.drops if m in self.mapping]
        """The budgets compared with the paper."""
        self.paper_objectives = paper.objectives
        """The objectives compared with the paper (any other, as task_ce, is an extension)."""
        self.seeds = sorted({c["seed"] for c in self.main})

    def log_ppl(self, cell: dict) -> float:
        value = average_perplexity(cell["metrics"], self.avg_tasks)
        return math.log(value) if value > 0 else math.nan

    def acc(self, cell: dict) -> float:
        return mean_accuracy(cell["metrics"], self.acc_metrics)

    def of(
        self, searches: Sequence[str], drops: Sequence[int] | None = None, *, paper_only: bool = False
    ) -> list[dict]:
        """The cells of ``searches`` at ``drops`` (all: None); ``paper_only``: of the paper's objectives."""
        return [
            c
            for c in self.main
            if c["search"] in searches
            and (drops is None or c["drop"] in drops)
            and (not paper_only or c["objective"] in self.paper_objectives)
        ]

    def per_cell(self, searches: Sequence[str], drops=None, *, paper_only: bool = False) -> dict[tuple, list]:
        """(configuration, M, seed) -> its cells of ``searches``."""
        groups = defaultdict(list)
        for cell in self.of(searches, drops, paper_only=paper_only):
            groups[(configuration(cell), cell["drop"], cell["seed"])].append(cell)
        return dict(sorted(groups.items()))


def cell_row(configuration_name: str, drop: int, seed: int, members: Sequence[dict], **values) -> dict:
    """A per-cell row of the reading's facts: the cell (configuration, M, seed), its variants, ``values``."""
    return {
        "configuration": configuration_name,
        "objective": members[0]["objective"],
        "drop": drop,
        "seed": seed,
        "n": len(members),
        **values,
    }


def seed_range(values: Sequence[float]) -> tuple[float, float] | None:
    """``(lowest, highest)`` of per-seed values (NaN left out); None when fewer than two remain."""
    finite = [v for v in values if not math.isnan(v)]
    return (min(finite), max(finite)) if len(finite) > 1 else None


def every_seed(seeds: Sequence[int]) -> str:
    """``in every seed`` over several seeds; ``in its one seed (0)`` over one: a single calibration draw
    behind a verdict is no "every"."""
    return "in every seed" if len(seeds) > 1 else f"in its one seed ({', '.join(map(str, seeds))})"


def range_text(found: tuple[float, float] | None, digits: int = 3, unit: str = "") -> str:
    """``; seeds 0.310–0.402`` (to close a parenthesis of pairs) or nothing for one seed."""
    if found is None:
        return ""
    return f"; seeds {found[0]:,.{digits}f}–{found[1]:,.{digits}f}{unit}"


def objective_label(objective: str, paper: PaperFacts = PAPER) -> str:
    """``task_ce (an extension: not in the paper)`` for an objective the paper did not run."""
    return objective if objective in paper.objectives else f"{objective} (an extension: not in the paper)"


def accuracy_items(study: dict) -> dict[str, int]:
    """Items per accuracy task: the ``task/n`` the evaluation recorded (the dense model's), else the
    study's ``eval_limit`` (studies judged before ``n`` was kept); a task with neither is left out."""
    dense = study.get("dense") or {}
    limit = study["summary"].get("eval_limit")
    items = {}
    for task in study.get("accuracy_metrics") or {}:
        n = dense.get(f"{task}/n") or limit
        if n:
            items[task] = int(n)
    return items


def effective_items(study: dict) -> float | None:
    """The n of one binomial with the variance of the mean accuracy over the tasks: k² / Σ 1/n_i (n for one
    task); None when a task's n is unknown."""
    items = accuracy_items(study)
    tasks = study.get("accuracy_metrics") or {}
    if not tasks or len(items) < len(tasks):
        return None
    return len(items) ** 2 / sum(1 / n for n in items.values())


def _domain_note(task: str, summary: dict) -> str:
    """Where ``task`` stands against the calibrations: in-domain for the perplexity objective (built from its
    source), the task objectives' own kind of item, or outside every calibration source."""
    notes = []
    for calibration in summary.get("calibrations", []):
        data = short_data(str(calibration["data"])).replace("_", "-")
        if calibration["objective"] == "perplexity" and task.startswith(data) and task != data:
            notes.append(
                f"in-domain for the perplexity objective (built from {data}, its calibration source)"
            )
        elif data == task and calibration["objective"] != "perplexity":
            notes.append("the task objectives' own kind of item (calibrated on other topics of it)")
    notes = list(dict.fromkeys(notes))
    return " and ".join(notes) if notes else "out of domain for every calibration (built from none of them)"


def evaluation_label(study: dict) -> dict:
    """What the accuracy is, named for what it is: ``{"short": "pydoc-cloze accuracy, 40 items", "full":
    short + ", in-domain for the perplexity objective (...)"}``. A task is in-domain for a perplexity
    calibration whose data its name extends (``pydoc_cloze`` of ``pydoc``), is the task objectives' own kind
    of item when they calibrate on it (other topics of the same source), and else out of every calibration's
    domain (``gcide_define``: dictionary definitions)."""
    summary = study["summary"]
    tasks = list(study.get("accuracy_metrics") or {})
    items = accuracy_items(study)
    names = {task: task.replace("_", "-") for task in tasks}
    if len(tasks) == 1:
        task = tasks[0]
        short = f"{names[task]} accuracy" + (f", {items[task]} items" if task in items else "")
        notes = _domain_note(names[task], summary)
        return {"short": short, "full": f"{short}, {notes}"}
    each = [names[task] + (f" ({items[task]} items)" if task in items else "") for task in tasks]
    short = f"mean accuracy over {', '.join(each)}"
    notes = [f"{names[task]} {_domain_note(names[task], summary)}" for task in tasks]
    return {"short": short, "full": f"{short}; {'; '.join(notes)}"}
