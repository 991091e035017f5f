"""The calibration-size arm's part of a study's reading: do more calibration questions rescue the task
objectives?

The SmolLM2 study calibrates every objective on 4 instances (the paper: 64 × 2048 tokens), and both task
objectives there lose accuracy against perplexity calibration. The arm reruns the task objectives with
more questions (``--samples 16``; 64 where affordable) at one budget, the paper's seven searches, judged on
the same yardstick; this module sets them beside the study's own cells of the same objectives, budget and
seeds, and beside perplexity calibration's (unchanged), and says whether the gap closes.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict

from pruning.study import statistics as study_stats
from pruning.study.reading_basis import STUDY_SEARCHES, Cells, budget_label, every_seed, seed_range
from pruning.study.tables import fmt

YARDSTICK = ("suites", "eval_limit", "eval_windows", "eval_seq_len")
"""Summary fields that must agree for the arm's numbers to compare with the study's."""


def _questions(study: dict, objective: str) -> int | None:
    """Calibration instances of ``objective`` in ``study`` (its summary's calibration of that objective)."""
    return next(
        (c["samples"] for c in study["summary"].get("calibrations", []) if c["objective"] == objective), None
    )


def _group(view: Cells, cells: list[dict]) -> dict:
    """J across searches (within a seed), geometric-mean perplexity and mean accuracy of ``cells``, with the
    per-seed values."""
    by_seed = defaultdict(list)
    for cell in cells:
        by_seed[cell["seed"]].append(cell)
    accuracy = {seed: statistics.fmean(view.acc(c) for c in members) for seed, members in by_seed.items()}
    return {
        "variants": len(cells),
        "seeds": sorted(by_seed),
        "j": study_stats.pooled_pairwise_jaccard(
            [[c["removed_blocks"] for c in m] for m in by_seed.values()]
        ).mean,
        "ppl_geomean": math.exp(statistics.fmean(view.log_ppl(c) for c in cells)),
        "acc": statistics.fmean(view.acc(c) for c in cells),
        "acc_by_seed": accuracy,
    }


def size_facts(study: dict, arm: dict | None) -> dict | None:
    """Per task objective and budget of the arm: the study's cells (its calibration size) and the arm's, on
    the seeds both ran, with perplexity calibration's beside them; None without an arm. ``comparable`` is
    False (and nothing else is computed) when the two were judged on different yardsticks."""
    if not arm:
        return None
    differs = [field for field in YARDSTICK if study["summary"].get(field) != arm["summary"].get(field)]
    if differs:
        return {"comparable": False, "differs": differs}
    main, extra = Cells(study), Cells({**arm, "accuracy_metrics": study.get("accuracy_metrics")})
    extra.avg_tasks = main.avg_tasks  # the same perplexities averaged as in the study
    rows = []
    for objective in sorted({c["objective"] for c in extra.main}):
        for drop in sorted({c["drop"] for c in extra.main if c["objective"] == objective}):
            arm_cells = [c for c in extra.of(STUDY_SEARCHES, [drop]) if c["objective"] == objective]
            seeds = {c["seed"] for c in arm_cells}
            own = [
                c
                for c in main.of(STUDY_SEARCHES, [drop])
                if c["objective"] == objective and c["seed"] in seeds
            ]
            text = [
                c
                for c in main.of(STUDY_SEARCHES, [drop])
                if c["objective"] == "perplexity" and c["seed"] in seeds
            ]
            if not own:
                continue
            rows.append(
                {
                    "objective": objective,
                    "drop": drop,
                    "samples": (_questions(study, objective), _questions(arm, objective)),
                    "study": _group(main, own),
                    "arm": _group(extra, arm_cells),
                    "perplexity": _group(main, text) if text else None,
                }
            )
    return {"comparable": True, "rows": rows}


def _verdict(row: dict) -> str:
    """Whether the larger calibration closes the accuracy gap to perplexity calibration (every seed), narrows
    it (the arm above the study in every seed), or neither."""
    study, arm, text = row["study"], row["arm"], row["perplexity"]
    seeds = [s for s in arm["acc_by_seed"] if s in study["acc_by_seed"]]
    higher = all(arm["acc_by_seed"][s] > study["acc_by_seed"][s] for s in seeds)
    every = every_seed(seeds)
    if text and all(arm["acc_by_seed"][s] >= text["acc_by_seed"].get(s, math.inf) for s in seeds):
        return f"**rescued**: as accurate as perplexity calibration {every}"
    if higher:
        return f"more accurate {every}, **not rescued**: still below perplexity calibration"
    return f"**not rescued**: not more accurate {every}"


def size_text(facts: dict) -> list[str]:
    found = facts.get("calibration_size")
    if not found:
        return []
    if not found["comparable"]:
        return [
            "**Calibration size.** The arm was judged on another yardstick (its "
            f"{', '.join(found['differs'])} differ from the study's): not compared."
        ]
    table = [
        "| objective | M | questions | variants (seeds) | J across searches | ppl (geometric mean) "
        "| accuracy (per-seed range) | perplexity calibration's accuracy |",
        "|---|---|---|---|---|---|---|---|",
    ]
    sentences = []
    for row in found["rows"]:
        text = row["perplexity"]
        for size, group in zip(row["samples"], (row["study"], row["arm"]), strict=True):
            span = seed_range(list(group["acc_by_seed"].values()))
            seeds = ", ".join(map(str, group["seeds"]))
            table.append(
                f"| {row['objective']} | {budget_label(facts, row['drop'])} | {size} | {group['variants']} "
                f"({seeds}) | {fmt(group['j'])} | {fmt(group['ppl_geomean'], 1)} | {fmt(group['acc'], 1)}"
                + (f" ({fmt(span[0], 1)}–{fmt(span[1], 1)})" if span else "")
                + f" | {fmt(text['acc'], 1) if text else '–'} |"
            )
        sentences.append(
            f"{row['objective']} at {budget_label(facts, row['drop'])}, {row['samples'][1]} questions "
            f"against {row['samples'][0]}: {_verdict(row)}"
        )
    return [
        f"**Calibration size: do more questions rescue the task objectives?** The task objectives again with "
        f"more calibration questions, the paper's seven searches, judged on the same yardstick "
        f"({facts['evaluation']['short']}) beside the study's own cells of the same seeds and perplexity "
        "calibration's (unchanged). " + "; ".join(sentences) + ".",
        "\n".join(table),
    ]
