"""What an independent audit of the study asks of its reading (issue 55): the searches' budgets beside the
spread of their accuracies, §5.2's ratio with a bootstrap interval, §5.3 on the calibration objective's own
value (what the paper correlates), and the variants that beat the dense model on their own calibration loss.

* **Budgets and σ².** The searches spend very different numbers of subset evaluations; a search whose found
  set scores *worse on its own calibration objective* than one_shot's (the M lowest single-block losses, the
  cheapest answer) failed at its own task, and its accuracy says nothing about the objective. σ² of accuracy
  across the seven is given with and without those searches, each beside its binomial floor.
* **§5.2 interval.** The ratio of mean |Δ accuracy| across configurations to across searches, resampled over
  seeds and searches (a two-way bootstrap: seeds with replacement, searches with replacement, pairs of two
  copies of one search left out, since they are no change of search).
* **§5.3 as the paper measures it.** Per cell, Spearman ρ of the calibration objective's value (lower =
  better) with accuracy, and of test perplexity with accuracy, each beside its permutation band (the 95 %
  range of ρ when accuracy is shuffled over the same values); a cell whose seven found fewer than
  :data:`MIN_DISTINCT_MASKS` distinct masks is named as such.
* **Beating dense.** A variant whose calibration loss is below the dense model's (``dense_loss``, recorded per
  cell) scores better than the unpruned model on the objective it was chosen by: the objective rewards
  something the model's quality does not, typically fitting its few calibration items.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from itertools import combinations

import numpy as np

from pruning.study import statistics as study_stats
from pruning.study.reading_basis import (
    PAPER,
    STUDY_SEARCHES,
    Cells,
    cell_row,
    configuration,
    effective_items,
)
from pruning.study.tables import fmt

BOOTSTRAP_DRAWS = 2000
BOOTSTRAP_SEED = 55
"""Draws and seed of §5.2's bootstrap (recorded so the interval is reproducible)."""
PERMUTATIONS = 2000
MIN_DISTINCT_MASKS = 4
"""Fewer distinct masks than this among a cell's seven: too few for a rank correlation to mean much."""
BASELINE = "one_shot"
"""The search whose found set a search must match on its own objective not to count as failing."""


# ------------------------------------------------------------------------------------------------- facts


def failing_searches(members: list[dict]) -> list[str]:
    """The searches of one cell (same configuration, M, seed) whose calibration loss is above one_shot's."""
    base = next((c for c in members if c["search"] == BASELINE), None)
    if base is None or base.get("calibration_loss") is None:
        return []
    return sorted(
        c["search"]
        for c in members
        if c.get("calibration_loss") is not None and c["calibration_loss"] > base["calibration_loss"] + 1e-9
    )


def _floor(cells: Cells, accuracies: list[float]) -> float:
    items = effective_items(cells.study)
    share = statistics.fmean(accuracies)
    return share * (100 - share) / items if items else math.nan


def budget_facts(cells: Cells) -> dict:
    """Per search: subset evaluations (median, range) on every budget; per configuration and M: σ² of accuracy
    across the seven with and without the searches failing their own objective (mean over seeds), the
    binomial floor, and which searches failed how often."""
    evaluations = defaultdict(list)
    for cell in cells.of(STUDY_SEARCHES):
        if cell.get("subset_evaluations") is not None:
            evaluations[cell["search"]].append(int(cell["subset_evaluations"]))
    per_search = {
        search: {"median": statistics.median(found), "low": min(found), "high": max(found)}
        for search, found in evaluations.items()
    }
    groups = defaultdict(list)
    for (name, drop, seed), members in cells.per_cell(STUDY_SEARCHES).items():
        groups[(name, drop)].append(members)
    rows = []
    for (name, drop), seeds in sorted(groups.items()):
        failed = defaultdict(int)
        kept_variance, all_variance, floors = [], [], []
        for members in seeds:
            failing = failing_searches(members)
            for search in failing:
                failed[search] += 1
            accs = [cells.acc(c) for c in members]
            kept = [cells.acc(c) for c in members if c["search"] not in failing]
            all_variance.append(study_stats.inter_method_variance(accs))
            kept_variance.append(study_stats.inter_method_variance(kept) if len(kept) > 1 else math.nan)
            floors.append(_floor(cells, accs))
        rows.append(
            {
                "configuration": name,
                "objective": seeds[0][0]["objective"],
                "drop": drop,
                "cells": len(seeds),
                "variance": statistics.fmean(all_variance),
                "variance_without_failing": _mean_finite(kept_variance),
                "floor": statistics.fmean(floors),
                "failing": dict(sorted(failed.items(), key=lambda item: (-item[1], item[0]))),
            }
        )
    return {"per_search": per_search, "variance": rows}


def _mean_finite(values: list[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return statistics.fmean(finite) if finite else math.nan


def _movement_table(cells: Cells, chosen: list[dict]) -> dict:
    """accuracy[(configuration, M, seed)][search] of ``chosen`` cells."""
    table = defaultdict(dict)
    for cell in chosen:
        table[(configuration(cell), cell["drop"], cell["seed"])][cell["search"]] = cells.acc(cell)
    return table


def _ratio(table: dict, configurations, drops, seeds, searches) -> float:
    """§5.2's ratio over drawn ``seeds`` and ``searches`` (lists with repeats): pairs of configurations under
    one drawn search, and pairs of drawn searches that are different searches."""
    across_configurations, across_searches = [], []
    for drop in drops:
        for seed in seeds:
            for search in searches:
                values = [table.get((c, drop, seed), {}).get(search) for c in configurations]
                values = [v for v in values if v is not None and not math.isnan(v)]
                across_configurations += [abs(a - b) for a, b in combinations(values, 2)]
            for name in configurations:
                row = table.get((name, drop, seed), {})
                drawn = [(s, row[s]) for s in searches if s in row and not math.isnan(row[s])]
                across_searches += [abs(a - b) for (s, a), (t, b) in combinations(drawn, 2) if s != t]
    if not across_configurations or not across_searches:
        return math.nan
    search_mean = statistics.fmean(across_searches)
    return statistics.fmean(across_configurations) / search_mean if search_mean else math.nan


def movement_interval(cells: Cells, *, paper_only: bool, drops=None) -> dict:
    """§5.2's ratio on the seven with a 95 % bootstrap interval over seeds and searches."""
    drops = list(drops if drops is not None else cells.like)
    chosen = cells.of(STUDY_SEARCHES, drops, paper_only=paper_only)
    table = _movement_table(cells, chosen)
    configurations = sorted({configuration(c) for c in chosen})
    seeds = sorted({c["seed"] for c in chosen})
    searches = [s for s in STUDY_SEARCHES if any(c["search"] == s for c in chosen)]
    ratio = _ratio(table, configurations, drops, seeds, searches)
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    draws = []
    for _ in range(BOOTSTRAP_DRAWS if len(configurations) > 1 and len(searches) > 1 else 0):
        drawn_seeds = list(rng.choice(seeds, size=len(seeds)))
        drawn_searches = list(rng.choice(searches, size=len(searches)))
        value = _ratio(table, configurations, drops, drawn_seeds, drawn_searches)
        if not math.isnan(value):
            draws.append(value)
    interval = tuple(float(q) for q in np.percentile(draws, [2.5, 97.5])) if draws else None
    return {
        "ratio": ratio,
        "ci95": interval,
        "configurations": configurations,
        "seeds": seeds,
        "searches": searches,
        "drops": drops,
        "draws": len(draws),
    }


def _spearman(values: list[float], accuracies: list[float]) -> float:
    """ρ of a lower-is-better value's ranking with accuracy's (as :func:`perplexity_accuracy_spearman`)."""
    return study_stats.perplexity_accuracy_spearman(values, accuracies)


def _permutation_band(values: list[float], accuracies: list[float], rng) -> tuple[float, float] | None:
    """The 95 % range of ρ over :data:`PERMUTATIONS` shuffles of the accuracies (ranks taken once, ties
    averaged, all shuffles in one matrix); None when either ranking is constant."""
    from scipy.stats import rankdata

    value_ranks = rankdata(values)
    accuracy_ranks = rankdata([-a for a in accuracies])
    if np.ptp(value_ranks) == 0 or np.ptp(accuracy_ranks) == 0:
        return None
    shuffled = rng.permuted(np.tile(accuracy_ranks, (PERMUTATIONS, 1)), axis=1)
    centred = value_ranks - value_ranks.mean()
    shuffled = shuffled - shuffled.mean(axis=1, keepdims=True)
    rho = shuffled @ centred / (np.linalg.norm(shuffled, axis=1) * np.linalg.norm(centred))
    return tuple(float(q) for q in np.percentile(rho, [2.5, 97.5]))


def calibration_spearman_facts(cells: Cells) -> dict:
    """Per cell of the seven: ρ(calibration loss, accuracy) and ρ(test perplexity, accuracy), each with its
    permutation band; distinct masks and tied values counted; per objective the signs of each."""
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    rows = []
    for (name, drop, seed), members in cells.per_cell(STUDY_SEARCHES).items():
        losses = [c.get("calibration_loss") for c in members]
        if any(loss is None for loss in losses):
            continue
        accs = [cells.acc(c) for c in members]
        ppls = [math.exp(cells.log_ppl(c)) for c in members]
        distinct = len({tuple(sorted(c["removed_blocks"])) for c in members})
        rows.append(
            cell_row(
                name,
                drop,
                seed,
                members,
                distinct_masks=distinct,
                tied_losses=len(losses) - len(set(losses)),
                rho_loss=_spearman(losses, accs),
                band_loss=_permutation_band(losses, accs, rng),
                rho_ppl=_spearman(ppls, accs),
                band_ppl=_permutation_band(ppls, accs, rng),
            )
        )
    by_objective = {}
    for objective in sorted({r["objective"] for r in rows}):
        chosen = [r for r in rows if r["objective"] == objective and r["drop"] in cells.like]
        usable = [r for r in chosen if r["distinct_masks"] >= MIN_DISTINCT_MASKS]
        by_objective[objective] = {
            "cells": len(chosen),
            "too_few_masks": len(chosen) - len(usable),
            **{
                f"{what}_{sign}": sum(test(r[f"rho_{what}"]) for r in usable)
                for what in ("loss", "ppl")
                for sign, test in (("positive", lambda v: v > 0), ("negative", lambda v: v < 0))
            },
            **{
                f"{what}_beyond_chance": sum(_beyond(r[f"rho_{what}"], r[f"band_{what}"]) for r in usable)
                for what in ("loss", "ppl")
            },
            "loss_mean": _mean_finite([r["rho_loss"] for r in usable]),
        }
    return {"cells": rows, "by_objective": by_objective}


def _beyond(rho: float, band) -> bool:
    return band is not None and not math.isnan(rho) and not band[0] <= rho <= band[1]


def dense_beating_facts(cells: Cells) -> list[dict]:
    """Per configuration: the seven's variants whose calibration loss is below the dense model's own."""
    groups = defaultdict(list)
    for cell in cells.of(STUDY_SEARCHES):
        if cell.get("dense_loss") is not None and cell.get("calibration_loss") is not None:
            groups[(configuration(cell), cell["objective"])].append(cell)
    return [
        {
            "configuration": name,
            "objective": objective,
            "variants": len(members),
            "below_dense": sum(c["calibration_loss"] < c["dense_loss"] for c in members),
            "median_ppl": statistics.median(math.exp(cells.log_ppl(c)) for c in members),
        }
        for (name, objective), members in sorted(groups.items())
    ]


def audit_facts(study: dict, arms: list[dict] | None = None) -> dict:
    """Every number of the audit's paragraphs, from ``study.json`` (and each arm's)."""
    cells = Cells(study)
    return {
        "arms": [arm_facts(arm, study) for arm in arms or []],
        "budgets": budget_facts(cells),
        "movement_like": movement_interval(cells, paper_only=True),
        "movement_every_objective": movement_interval(cells, paper_only=False),
        "calibration_spearman": calibration_spearman_facts(cells),
        "beating_dense": dense_beating_facts(cells),
    }


def arm_facts(arm: dict, study: dict | None = None) -> dict:
    """§5.2 on an arm of more calibration questions (every configuration it ran), with its bootstrap interval,
    and its variants that beat dense on their own calibration loss. With the main ``study``, §5.2 also on the
    paper's pair of objectives: the arm's task_margin against the study's perplexity cells of the same M,
    seeds and searches (a perplexity calibration asks no questions, so those cells are the arm's as much as
    the study's; judged on the same yardstick)."""
    cells = Cells(arm)
    questions = sorted({c["samples"] for c in arm["summary"].get("calibrations", [])})
    clips = {c["objective"]: c["margin_clip"] for c in arm["summary"]["calibrations"] if c.get("margin_clip")}
    found = {
        "questions": questions,
        "margin_clip": clips,
        "movement": movement_interval(cells, paper_only=False, drops=cells.drops),
        "beating_dense": dense_beating_facts(cells),
        "budgets": budget_facts(cells),
    }
    borrowed = [
        cell
        for cell in (study or {}).get("cells", [])
        if cell["objective"] == "perplexity" and cell["drop"] in cells.drops and cell["seed"] in cells.seeds
    ]
    if borrowed:
        joined = Cells({**arm, "cells": arm["cells"] + borrowed})
        found["movement_with_perplexity"] = movement_interval(joined, paper_only=True, drops=cells.drops)
    return found


# ------------------------------------------------------------------------------------------------- text


def _interval(found: dict) -> str:
    low_high = found["ci95"]
    ratio = fmt(found["ratio"], 2)
    if low_high is None:
        return ratio
    return f"{ratio} [95 % {low_high[0]:.2f}, {low_high[1]:.2f}; {found['draws']} bootstrap draws]"


def budgets_text(facts: dict) -> str:
    """The searches' subset evaluations, and σ² with and without the searches failing their own objective."""
    budgets = facts["audit"]["budgets"]
    spent = ", ".join(
        f"{search} {row['median']:.0f}"
        + (f" ({row['low']}–{row['high']})" if row["low"] != row["high"] else "")
        for search, row in budgets["per_search"].items()
    )
    rows = []
    for row in budgets["variance"]:
        if row["drop"] not in facts["like_budgets"]:
            continue
        failing = ", ".join(f"{s} in {k} of {row['cells']}" for s, k in row["failing"].items()) or "none"
        rows.append(
            f"{row['configuration']} at M = {row['drop']}: σ² {fmt(row['variance'], 1)} with all seven, "
            f"{fmt(row['variance_without_failing'], 1)} without the searches failing their own objective "
            f"({failing}), binomial floor {fmt(row['floor'], 1)}"
        )
    summary = facts["summary"]
    matched = ", ".join(
        f"{search} at {options['evaluations']}"
        for search, options in (summary.get("options") or {}).items()
        if "evaluations" in options
    )
    return (
        "**Search budgets and the spread between searches.** Subset evaluations per search (median, range, "
        f"every cell): {spent}"
        + (
            f"; budgets set in subset evaluations: {matched} (greedy's count at the cell's M)"
            if matched
            else ""
        )
        + f". A search fails its own objective when its set scores worse on the calibration loss than "
        f"{BASELINE}'s (the cheapest answer); its accuracy then says nothing about the objective. σ² of "
        "accuracy across the seven (points², mean over seeds), the paper's budgets: "
        + "; ".join(rows)
        + ". A σ² near its floor is no disagreement between the searches beyond chance."
    )


def movement_interval_text(facts: dict) -> str:
    audit = facts["audit"]
    text = (
        "**§5.2's ratio with its uncertainty.** Resampling seeds and searches (both with replacement; two "
        "copies of one search are no change of search): the paper's budgets and objectives "
        f"{_interval(audit['movement_like'])}; with every objective "
        f"{_interval(audit['movement_every_objective'])}; the paper: "
        f"{PAPER.movement_configuration_mean / PAPER.movement_search_mean:.2f}."
    )
    for arm in audit.get("arms", []):
        clipped = ", ".join(f"{o} clipped at ±{t:g}" for o, t in arm["margin_clip"].items())
        text += (
            f" On the arm of {'/'.join(map(str, arm['questions']))} calibration questions "
            f"({', '.join(arm['movement']['configurations'])}{'; ' + clipped if clipped else ''}; seeds "
            f"{', '.join(map(str, arm['movement']['seeds']))}): {_interval(arm['movement'])}."
        )
        if arm.get("movement_with_perplexity"):
            text += (
                " Its task_margin against the main study's perplexity cells (same M, seeds and searches; the "
                f"paper's pair of objectives in this regime): {_interval(arm['movement_with_perplexity'])}."
            )
    return (
        text
        + " Each verdict holds for the regime it was measured in: few calibration items, one small model."
    )


def calibration_spearman_text(facts: dict) -> str:
    found = facts["audit"]["calibration_spearman"]
    parts = []
    for objective, row in found["by_objective"].items():
        usable = row["cells"] - row["too_few_masks"]
        parts.append(
            f"{objective}: ρ(calibration loss, accuracy) positive in {row['loss_positive']} of {usable} "
            f"cells, negative in {row['loss_negative']}, beyond its permutation band in "
            f"{row['loss_beyond_chance']} "
            f"(mean ρ {fmt(row['loss_mean'], 2)}); ρ(test perplexity, accuracy) positive in "
            f"{row['ppl_positive']}, negative in {row['ppl_negative']}, beyond chance in "
            f"{row['ppl_beyond_chance']}"
            + (
                f"; {row['too_few_masks']} cell(s) with fewer than {MIN_DISTINCT_MASKS} distinct masks left "
                "out"
                if row["too_few_masks"]
                else ""
            )
        )
    few = [
        f"{r['configuration']} M = {r['drop']} seed {r['seed']} ({r['distinct_masks']} distinct masks)"
        for r in found["cells"]
        if r["distinct_masks"] < MIN_DISTINCT_MASKS and r["drop"] in facts["like_budgets"]
    ]
    return (
        "**§5.3 as the paper measures it: the calibration objective's own value against accuracy.** Per cell "
        "(configuration, M, seed) of the seven at the paper's budgets, Spearman ρ of the calibration loss "
        "(lower = better) with accuracy, and of test perplexity with accuracy, each against its permutation "
        f"band (the 95 % range of ρ with accuracy shuffled, {PERMUTATIONS} shuffles): "
        + "; ".join(parts)
        + ". With seven variants per cell the band is wide (about ±0.75), so a sign alone is weak evidence."
        + (f" Too few distinct masks: {'; '.join(few)}." if few else "")
    )


def beating_dense_text(facts: dict) -> str:
    rows = list(facts["audit"]["beating_dense"])
    for arm in facts["audit"].get("arms", []):
        size = "/".join(map(str, arm["questions"]))
        rows += [
            {**r, "configuration": f"{r['configuration']} ({size} questions)"} for r in arm["beating_dense"]
        ]
    parts = [
        f"{r['configuration']}: {r['below_dense']} of {r['variants']} (median test perplexity "
        f"{fmt(r['median_ppl'], 1)})"
        for r in rows
    ]
    return (
        "**Variants that beat the dense model on their own calibration loss** (the cell's `dense_loss`, the "
        "dense model's value of the same loss on the same items): "
        + "; ".join(parts)
        + ". A variant chosen from millions of sets for a lower loss on a few items, and scoring below the "
        "unpruned model there, was fitted to those items: that loss no longer measures the model's quality "
        "(its held-out accuracy and perplexity are far worse than dense's), and a ratio built on such "
        "variants measures the objective's collapse as much as the search's or the calibration's effect."
    )


def audit_text(facts: dict) -> list[str]:
    if not facts.get("audit"):
        return []
    return [
        budgets_text(facts),
        movement_interval_text(facts),
        calibration_spearman_text(facts),
        beating_dense_text(facts),
    ]
