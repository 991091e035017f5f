"""The reading's comparisons with the paper, like with like (issue 42): §5.2's accuracy movement as a ratio of
means with its per-seed range and a plain verdict on the paper's conclusion, §5.3's rank agreement counted per
objective beside the paper's per-objective counts, and mask agreement across searches per objective beside
the agreement across calibration draws.

Like with like: the paper's budgets (:func:`pruning.study.reading_basis.paper_budgets`), the paper's seven
searches and the paper's objectives (perplexity and the task margin); task_ce and any other budget are
extensions, reported apart and labelled.
"""

from __future__ import annotations

import math
from collections import defaultdict

from pruning.study import statistics as study_stats
from pruning.study.reading_basis import (
    PAPER,
    STUDY_SEARCHES,
    Cells,
    PaperFacts,
    cell_row,
    configuration,
    every_seed,
    objective_label,
    range_text,
    seed_range,
)
from pruning.study.tables import fmt

# ------------------------------------------------------------------------------------------------- facts


def _movement(cells: Cells, drops, paper_only: bool, seed=None) -> dict:
    accuracies = {
        (configuration(c), c["search"], c["drop"], c["seed"]): cells.acc(c)
        for c in cells.of(STUDY_SEARCHES, drops, paper_only=paper_only)
        if seed is None or c["seed"] == seed
    }
    movement = study_stats.accuracy_movement(accuracies)
    ratio = (
        movement.across_configurations_mean / movement.across_searches_mean
        if movement.across_searches_mean
        else math.nan
    )
    return {
        "configuration_mean": movement.across_configurations_mean,
        "search_mean": movement.across_searches_mean,
        "ratio": ratio,
        "pairs": (movement.configuration_pairs, movement.search_pairs),
    }


def movement_facts(cells: Cells) -> dict:
    """§5.2 on the seven: mean |Δ acc| across configurations vs across searches and their ratio, with the
    per-seed range of each; ``like``: the paper's budgets and objectives, ``with_task_ce``: the paper's
    budgets, every objective, ``all``: every budget and objective."""
    results = {}
    for name, drops, paper_only in (
        ("like", cells.like, True),
        ("with_task_ce", cells.like, False),
        ("all", cells.drops, False),
    ):
        result = _movement(cells, drops, paper_only)
        per_seed = [_movement(cells, drops, paper_only, seed) for seed in cells.seeds]
        for field in ("configuration_mean", "search_mean", "ratio"):
            result[f"{field}_seeds"] = seed_range([r[field] for r in per_seed])
        result["seeds"] = [
            seed for seed, r in zip(cells.seeds, per_seed, strict=True) if not math.isnan(r["ratio"])
        ]
        results[name] = result
    return results


def spearman_facts(cells: Cells) -> dict:
    """Per-cell ρ over the seven, its signs counted per objective on the paper's budgets, and the pooled ρ."""
    rows, pooled_ppl, pooled_acc = [], [], []
    for (name, drop, seed), members in cells.per_cell(STUDY_SEARCHES).items():
        ppl = [math.exp(cells.log_ppl(c)) for c in members]
        acc = [cells.acc(c) for c in members]
        pooled_ppl += ppl
        pooled_acc += acc
        rho = study_stats.perplexity_accuracy_spearman(ppl, acc)
        rows.append(cell_row(name, drop, seed, members, rho=rho))

    def signs(chosen: list[dict]) -> dict:
        return {
            "positive": sum(r["rho"] > 0 for r in chosen),
            "negative": sum(r["rho"] < 0 for r in chosen),
            "zero": sum(r["rho"] == 0 for r in chosen),
            "undefined": sum(math.isnan(r["rho"]) for r in chosen),
            "cells": len(chosen),
        }

    like = [r for r in rows if r["drop"] in cells.like]
    return {
        "cells": rows,
        "by_objective": {
            objective: signs([r for r in like if r["objective"] == objective])
            for objective in sorted({r["objective"] for r in like})
        },
        "all": signs(rows),
        "pooled": study_stats.perplexity_accuracy_spearman(pooled_ppl, pooled_acc),
    }


def objective_agreement_facts(cells: Cells) -> list[dict]:
    """Per configuration on the paper's budgets: mean J of the seven's masks across searches (within one
    calibration draw, M and seed) with its per-seed range, and across draws (one search, its masks over the
    seeds)."""
    rows = []
    for name in sorted({configuration(c) for c in cells.main}):
        chosen = [c for c in cells.of(STUDY_SEARCHES, cells.like) if configuration(c) == name]
        if not chosen:
            continue
        within, across = defaultdict(list), defaultdict(list)
        for cell in chosen:
            within[(cell["drop"], cell["seed"])].append(cell["removed_blocks"])
            across[(cell["drop"], cell["search"])].append(cell["removed_blocks"])
        per_seed = [
            study_stats.pooled_pairwise_jaccard([m for (_, s), m in within.items() if s == seed]).mean
            for seed in cells.seeds
        ]
        searches = study_stats.pooled_pairwise_jaccard(list(within.values()))
        draws = study_stats.pooled_pairwise_jaccard(list(across.values()))
        rows.append(
            {
                "configuration": name,
                "objective": chosen[0]["objective"],
                "across_searches": searches.mean,
                "across_searches_seeds": seed_range(per_seed),
                "search_pairs": searches.pairs,
                "across_draws": draws.mean,
                "draw_pairs": draws.pairs,
            }
        )
    return rows


# ------------------------------------------------------------------------------------------------- text


def ratio_text(result: dict) -> str:
    seeds = range_text(result["ratio_seeds"], 2)
    return fmt(result["ratio"], 2) + (f" ({seeds[2:]})" if seeds else "")


def movement_text(facts: dict, paper: PaperFacts = PAPER) -> list[str]:
    """§5.2: the ratio of means, per-seed ranges, and whether the result supports the paper's conclusion
    (the paper's ratio inside the per-seed range of ours: it does; every seed on one side: it does not)."""
    if not facts["like_budgets"]:
        return ["**Accuracy movement (§5.2).** No budget of this study matches the paper's: not compared."]
    movement = facts["movement"]
    like = movement["like"]
    paper_ratio = paper.movement_configuration_mean / paper.movement_search_mean
    verdict = movement_verdict(like, paper)
    text = (
        f"**Accuracy movement (§5.2), {facts['evaluation']['full']}: means with means, the seven, the "
        f"paper's budgets and objectives ({', '.join(facts['paper_objectives'])}).** A change of "
        f"configuration moves the mean accuracy by {fmt(like['configuration_mean'], 2)} points "
        f"({like['pairs'][0]} pairs"
        f"{range_text(like['configuration_mean_seeds'], 2)}), a change of search by "
        f"{fmt(like['search_mean'], 2)} ({like['pairs'][1]} pairs"
        f"{range_text(like['search_mean_seeds'], 2)}): "
        f"ratio {ratio_text(like)}; the paper: {paper.movement_configuration_mean} and "
        f"{paper.movement_search_mean} points, ratio {paper_ratio:.2f}. {verdict}{regime_text(facts)}."
    )
    extra = movement["with_task_ce"]
    if extra["pairs"] != like["pairs"]:
        text += (
            f" With task_ce (an extension) as a third configuration: ratio {ratio_text(extra)} "
            f"({fmt(extra['configuration_mean'], 2)} against {fmt(extra['search_mean'], 2)} points)."
        )
    if len(facts["like_budgets"]) < len(facts["budgets"]):
        everything = movement["all"]
        text += f" With every extension (budgets and objectives): ratio {ratio_text(everything)}."
    return [text]


def regime_text(facts: dict) -> str:
    """The regime a §5.2 verdict holds in: the calibration's size, and how many task-objective variants beat
    the dense model on their own calibration loss (:mod:`pruning.study.reading_audit`)."""
    sizes = sorted({c["samples"] for c in facts["summary"].get("calibrations", [])})
    found = (facts.get("audit") or {}).get("beating_dense", [])
    beating = [r for r in found if r["objective"] != "perplexity"]
    text = f" (a verdict for this regime: {'/'.join(map(str, sizes))} calibration instances"
    if beating:
        counted = ", ".join(f"{r['objective']} {r['below_dense']} of {r['variants']}" for r in beating)
        text += f"; variants scoring below dense on their own calibration loss: {counted}"
    return text + ")" if sizes else ""


def movement_verdict(like: dict, paper: PaperFacts = PAPER) -> str:
    """Whether a §5.2 result (ratio with its per-seed range) supports the paper's conclusion: the paper's
    ratio inside the per-seed range, it does; every seed on one side, it does not."""
    paper_ratio = paper.movement_configuration_mean / paper.movement_search_mean
    low, high = like["ratio_seeds"] or (like["ratio"], like["ratio"])
    if not (math.isfinite(low) and math.isfinite(high)):  # no pair of configurations or of searches
        return "Not determined: no two configurations (or no two searches) to compare"
    if low <= paper_ratio <= high:
        return "This supports the paper's conclusion that the two move accuracy comparably"
    if low > paper_ratio:
        return (
            "**This does not support the paper's conclusion** that configuration and search move accuracy "
            f"comparably: {every_seed(like['seeds'])} a change of configuration moves it {fmt(low, 2)}× or "
            "more what a change of search does"
        )
    return (
        f"**This does not support the paper's conclusion**: {every_seed(like['seeds'])} a change of search "
        "moves accuracy more than the paper's ratio allows"
    )


def objective_verdict(found: dict, sign: str, count: int, of: int) -> str:
    """``agrees``/``disagrees`` with the paper's majority sign for one objective."""
    ours = "positive" if found["positive"] > found["negative"] else "negative"
    if found["positive"] == found["negative"]:
        return "neither sign dominates here"
    majority = sign if 2 * count > of else ("negative" if sign == "positive" else "positive")
    return "**an agreement**" if ours == majority else "**a disagreement**"


def spearman_text(facts: dict, paper: PaperFacts = PAPER) -> list[str]:
    """§5.3 per objective: "k of n" cells of each sign beside the paper's count for the same objective."""
    spearman = facts["spearman"]
    paper_signs = {objective: (sign, k, n) for objective, sign, k, n in paper.spearman_signs}
    sentences = []
    for objective, found in spearman["by_objective"].items():
        counted = (
            f"{objective}: ρ positive in {found['positive']} of {found['cells']} cells, negative in "
            f"{found['negative']}"
            + (f", exactly 0 in {found['zero']} (ties)" if found["zero"] else "")
            + (f", undefined in {found['undefined']} (a constant ranking)" if found["undefined"] else "")
        )
        if objective in paper_signs:
            sign, count, of = paper_signs[objective]
            verdict = objective_verdict(found, sign, count, of)
            counted += f"; the paper: {sign} in {count} of {of}: {verdict}"
        else:
            counted = counted.replace(objective, objective_label(objective, paper), 1)
        sentences.append(counted)
    rows = ", ".join(
        f"{r['configuration']} M = {r['drop']} seed {r['seed']}: {fmt(r['rho'], 2)}"
        for r in spearman["cells"]
        if r["drop"] in facts["like_budgets"]
    )
    text = (
        f"**Perplexity rank vs accuracy rank (§5.3), {facts['evaluation']['full']}: per cell (configuration, "
        "M, seed), the seven, the paper's budgets, counted per objective as the paper counts them.** "
        + "; ".join(sentences)
        + f". A positive ρ means a lower perplexity goes with a higher accuracy. Per cell: {rows or 'none'}. "
        f"Pooled over every variant of every cell ρ = {fmt(spearman['pooled'], 2)}: pooling mixes "
        "configurations and budgets whose quality differs widely, so it is not the paper's per-cell "
        "statistic and is not quoted as agreement."
    )
    return [text]


def objective_agreement_text(facts: dict, paper: PaperFacts = PAPER) -> list[str]:
    """J across searches per objective, J across calibration draws beside it."""
    rows = facts["objective_agreement"]
    if not rows:
        return []
    parts = [
        f"{objective_label(r['objective'], paper).replace(r['objective'], r['configuration'], 1)}: "
        f"J across searches {fmt(r['across_searches'])} ({r['search_pairs']} pairs"
        f"{range_text(r['across_searches_seeds'])}), across draws {fmt(r['across_draws'])} "
        f"({r['draw_pairs']} pairs)"
        for r in rows
    ]
    return [
        "**Do the searches converge under a fixed objective?** Per configuration, the seven, the paper's "
        "budgets: mean Jaccard of the masks of different searches (same draw, M and seed), and of one "
        "search's masks across the calibration draws (the seeds) beside it. "
        + "; ".join(parts)
        + ". Searches converge where J across searches is well above J across draws."
    ]
