"""The reading's §5.2 and §5.3 on each accuracy task alone, when a study measured several.

A study's accuracy is the mean over its tasks, and the SmolLM2 study's suite mixes a task in-domain for the
perplexity objective (pydoc-cloze, built from its calibration source) with one outside every calibration's
domain (GCIDE-define). A cloze on the perplexity objective's own text is nearly a perplexity measure and
favours that objective by construction (issue 42's audit), so the paper's two comparisons are also stated per
task: a conclusion that holds only on the in-domain task is the yardstick's, not the calibration's.
"""

from __future__ import annotations

import copy

from pruning.study.reading_basis import PAPER, Cells, PaperFacts, evaluation_label
from pruning.study.reading_compare import (
    movement_facts,
    movement_verdict,
    objective_verdict,
    ratio_text,
    spearman_facts,
)


def per_task_facts(cells: Cells) -> list[dict]:
    """Per accuracy task (only when there are several): its label, §5.3 sign counts per objective on the
    paper's budgets, and §5.2 on the paper's budgets and objectives."""
    if len(cells.acc_metrics) < 2 or not cells.like:
        return []
    rows = []
    for task, metric in cells.acc_metrics.items():
        alone = copy.copy(cells)
        alone.acc_metrics = {task: metric}
        study = {**cells.study, "accuracy_metrics": {task: metric}}
        rows.append(
            {
                "task": task,
                "label": evaluation_label(study)["full"],
                "spearman": spearman_facts(alone)["by_objective"],
                "movement": movement_facts(alone)["like"],
            }
        )
    return rows


def per_task_text(facts: dict, paper: PaperFacts = PAPER) -> list[str]:
    """One sentence group per task: §5.3 counted per paper objective against the paper, §5.2's ratio and
    whether it supports the paper's conclusion."""
    rows = facts.get("per_task") or []
    if not rows:
        return []
    paper_signs = {objective: (sign, k, n) for objective, sign, k, n in paper.spearman_signs}
    parts = []
    for row in rows:
        signs = []
        for objective, found in row["spearman"].items():
            if objective not in paper_signs:
                continue  # an extension: the per-task reading compares with the paper only
            sign, count, of = paper_signs[objective]
            signs.append(
                f"{objective} ρ positive in {found['positive']} of {found['cells']}, negative in "
                f"{found['negative']} ({objective_verdict(found, sign, count, of)} with the paper's {sign} "
                f"{count} of {of})"
            )
        movement = row["movement"]
        verdict = movement_verdict(movement, paper).replace("**", "")
        parts.append(
            f"*{row['label']}*: §5.3 {'; '.join(signs) or 'not measured'}; §5.2 ratio "
            f"{ratio_text(movement)}: {verdict[0].lower()}{verdict[1:]}"
        )
    return [
        "**Each accuracy task alone (§5.2 and §5.3 on the paper's budgets and objectives).** The mean above "
        "mixes tasks that stand differently to the calibrations; a conclusion that holds on one task only is "
        "that task's. " + ". ".join(parts) + "."
    ]
