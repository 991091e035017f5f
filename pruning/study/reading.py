"""The study's reading, generated from ``study.json``: every number it compares with the paper, like for like.

:func:`reading_facts` computes the numbers (plain values, so tests can check them by hand) and
:func:`render_reading` fills the reading's template with them; :func:`write_reading` writes ``reading.md`` and
re-renders the report's ``README.md`` and ``report.html`` around it (figures and ``study.json`` untouched)::

    .venv/bin/python -m benchmarks.study_reading docs/study-smollm2-135m \
        --cross docs/study-smollm2-135m/cross-controls --write

Rules (issue 29), so that a sentence never says more than the numbers:

* **Same search set.** Comparisons with the paper use the paper's seven searches
  (:data:`pruning.search.STUDY_SEARCHES`); the objective-blind baselines (block_influence, lorp, streamline)
  are reported apart.
* **Same budgets.** The paper removes M = 7 and 9 of 32 blocks; for N blocks the proportional budgets are
  round(7N/32) and round(9N/32) (:func:`paper_budgets`). Those are compared with the paper; any other budget
  is labelled an extension and kept out of the comparisons.
* **Mean with mean.** §5.2's accuracy movement is compared as means (the paper: 2.06 points for a change of
  configuration, 1.85 for a change of search).
* **Per cell next to pooled.** Spearman ρ and mask agreement are given per cell (calibration, M, seed) and
  pooled; the paper's "negative in 5 of 6 cells" is compared with the per-cell signs.
* **Disagreements are stated as such**, and the spread of perplexity is taken on log perplexity.
* **What the data lacks is said**: cells without ``data_seed`` (read from the key then) or
  ``truncated_items``.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from ground.core.objectives import MULTIPLE_CHOICE, get_objective
from pruning.study import statistics as study_stats
from pruning.study.cross_reading import cross_facts, cross_text, text_seq_len
from pruning.study.reading_audit import audit_facts, audit_text
from pruning.study.reading_basis import (
    PAPER,
    STUDY_SEARCHES,
    Cells,
    PaperFacts,
    accuracy_items,
    budget_label,
    configuration,
    effective_items,
    evaluation_label,
    objective_label,
    paper_budgets,
    provenance_facts,
    range_text,
    seed_range,
)
from pruning.study.reading_compare import (
    movement_facts,
    movement_text,
    objective_agreement_facts,
    objective_agreement_text,
    spearman_facts,
    spearman_text,
)
from pruning.study.reading_tasks import per_task_facts, per_task_text
from pruning.study.size_reading import size_facts, size_text
from pruning.study.tables import fmt, short_data, window_cap

# ------------------------------------------------------------------------------------------------- facts


def budget_facts(cells: Cells) -> list[dict]:
    """Each budget with its fraction and the paper's budget it matches (None: an extension)."""
    return [{"drop": m, "fraction": m / cells.num_blocks, "paper": cells.mapping.get(m)} for m in cells.drops]


def _headline(cells: Cells, searches, drops, *, paper_only: bool, seed=None):
    masks = {
        (configuration(c), c["search"], c["drop"], c["seed"]): c["removed_blocks"]
        for c in cells.of(searches, drops, paper_only=paper_only)
        if seed is None or c["seed"] == seed
    }
    return study_stats.headline_comparison(masks)


def headline_facts(cells: Cells) -> dict:
    """Mask agreement across searches vs across calibrations: the seven per budget on the paper's objectives
    (per-seed ranges beside), with task_ce apart; the baselines apart, on the paper's budgets and objectives;
    the per-cell J of the seven on the paper's budgets and objectives, the extensions' apart."""
    seven = [s for s in STUDY_SEARCHES if any(c["search"] == s for c in cells.main)]
    baselines = sorted({c["search"] for c in cells.main} - set(STUDY_SEARCHES))
    by_drop = {}
    for drop in [*cells.drops, "like"]:
        drops = cells.like if drop == "like" else [drop]
        result = _headline(cells, seven, drops, paper_only=True)
        per_seed = [_headline(cells, seven, drops, paper_only=True, seed=seed) for seed in cells.seeds]
        by_drop[str(drop)] = {
            "across_searches": result.across_searches_same_objective,
            "across_calibrations": result.across_objectives_same_search,
            "pairs": (result.search_pairs, result.objective_pairs),
            "agrees": result.calibration_matters_more,
            "across_searches_seeds": seed_range([r.across_searches_same_objective for r in per_seed]),
            "across_calibrations_seeds": seed_range([r.across_objectives_same_search for r in per_seed]),
        }
    everything = _headline(cells, seven, cells.like, paper_only=False)
    per_baseline = {}
    for search in baselines:
        per_baseline[search] = _headline(
            cells, [search], cells.like, paper_only=True
        ).across_objectives_same_search
    per_cell = {
        like: [
            study_stats.pairwise_jaccard([c["removed_blocks"] for c in members]).mean
            for (_, drop, _), members in cells.per_cell(seven).items()
            if (drop in cells.like and members[0]["objective"] in cells.paper_objectives) == like
        ]
        for like in (True, False)
    }
    pooled = _headline(cells, seven + baselines, cells.like, paper_only=True)
    return {
        "seven": seven,
        "by_drop": by_drop,
        "with_task_ce": (everything.across_searches_same_objective, everything.across_objectives_same_search),
        "baselines": per_baseline,
        "with_baselines": (pooled.across_searches_same_objective, pooled.across_objectives_same_search),
        "per_cell_search_j": per_cell[True],
        "per_cell_search_j_extensions": per_cell[False],
    }


def _binomial_floor(cells: Cells, groups) -> float:
    """The binomial variance p(1 − p)/n of one n-item accuracy at each cell's mean accuracy, in points²,
    mean over the cells (NaN when n is not recorded): the σ² across the seven that noise alone gives."""
    items = effective_items(cells.study)
    if not items:
        return math.nan
    shares = [statistics.fmean(cells.acc(c) for c in group) for group in groups]
    return statistics.fmean(p * (100 - p) / items for p in shares)


def quality_facts(cells: Cells) -> list[dict]:
    """Per configuration and M over the seven (seeds pooled): geometric-mean perplexity, σ² of log ppl and
    of accuracy across the seven per cell (mean over seeds) with accuracy's binomial floor, accuracy
    mean (per seed too)/best/worst, the lowest-loss pick."""
    rows = []
    groups = defaultdict(list)
    for cell in cells.of(STUDY_SEARCHES):
        groups[(configuration(cell), cell["drop"])].append(cell)
    for (name, drop), group in sorted(groups.items()):
        logs, accs = [cells.log_ppl(c) for c in group], [cells.acc(c) for c in group]
        seeds = defaultdict(list)
        for cell in group:
            seeds[cell["seed"]].append(cell)
        best = min(group, key=lambda c: (c["calibration_loss"], c["seed"]))
        rows.append(
            {
                "configuration": name,
                "objective": group[0]["objective"],
                "drop": drop,
                "variants": len(group),
                "ppl_geomean": math.exp(statistics.fmean(logs)),
                "log_ppl_variance": statistics.fmean(
                    study_stats.inter_method_variance([cells.log_ppl(c) for c in m]) for m in seeds.values()
                ),
                "acc_variance": statistics.fmean(
                    study_stats.inter_method_variance([cells.acc(c) for c in m]) for m in seeds.values()
                ),
                "acc_floor": _binomial_floor(cells, seeds.values()),
                "acc_mean": statistics.fmean(accs),
                "acc_mean_by_seed": {
                    seed: statistics.fmean(cells.acc(c) for c in m) for seed, m in seeds.items()
                },
                "acc_best": max(accs),
                "acc_worst": min(accs),
                "lowest_loss": (best["search"], best["seed"], math.exp(cells.log_ppl(best)), cells.acc(best)),
            }
        )
    return rows


def seed_facts(cells: Cells) -> dict:
    """How many (configuration, M, search) found more than one mask over the seeds."""
    masks = defaultdict(set)
    for cell in cells.main:
        masks[(configuration(cell), cell["drop"], cell["search"])].add(tuple(sorted(cell["removed_blocks"])))
    changed = {key: len(found) for key, found in masks.items() if len(found) > 1}
    return {"groups": len(masks), "changed": changed, "across_draws": draw_facts(cells)}


def draw_facts(cells: Cells) -> list[dict]:
    """Mean Jaccard of one search's masks across seeds (same configuration and M), the paper's objectives as
    the headline: with each seed its own calibration draw, how far the draw moves the mask; the seven and the
    baselines apart, per M."""
    by_search = defaultdict(list)
    for cell in (c for c in cells.main if c["objective"] in cells.paper_objectives):
        by_search[(cell["drop"], cell["search"], configuration(cell))].append(cell["removed_blocks"])
    rows = []
    for drop in cells.drops:
        row = {"drop": drop}
        for group, members in (("seven", True), ("baselines", False)):
            pooled = study_stats.pooled_pairwise_jaccard(
                [
                    found
                    for (m, search, _), found in by_search.items()
                    if m == drop and (search in STUDY_SEARCHES) == members
                ]
            )
            row[group], row[f"{group}_pairs"] = pooled.mean, pooled.pairs
        rows.append(row)
    return rows


def prior_facts(cells: Cells) -> list[dict]:
    """The random-prior control beside its single-block twin (same configuration, M, search, seed)."""
    twins = {(configuration(c), c["drop"], c["search"], c["seed"]): c for c in cells.main}
    pairs = defaultdict(list)
    for cell in cells.all:
        twin = twins.get((configuration(cell), cell["drop"], cell["search"], cell["seed"]))
        if cell["prior"] == "random" and twin is not None:
            pairs[(configuration(cell), cell["drop"], cell["search"])].append((twin, cell))
    return [
        {
            "configuration": name,
            "drop": drop,
            "search": search,
            "seeds": len(found),
            "loss_change": statistics.fmean(r["calibration_loss"] - g["calibration_loss"] for g, r in found),
            "ppl": tuple(math.exp(statistics.fmean(cells.log_ppl(c[i]) for c in found)) for i in (0, 1)),
            "acc": tuple(statistics.fmean(cells.acc(c[i]) for c in found) for i in (0, 1)),
            "same_mask": sum(sorted(g["removed_blocks"]) == sorted(r["removed_blocks"]) for g, r in found),
        }
        for (name, drop, search), found in sorted(pairs.items())
    ]


def reading_facts(
    study: dict, cross: dict | None = None, size: dict | None = None, arms: list[dict] | None = None
) -> dict:
    """Every number the reading quotes, computed from ``study.json`` (and the cross-controls', the
    calibration-size arm's and the audit's arms', :mod:`pruning.study.reading_audit`)."""
    cells = Cells(study)
    return {
        "model": study["summary"].get("model_name") or study["summary"]["model"],
        "num_blocks": cells.num_blocks,
        "summary": study["summary"],
        "budgets": budget_facts(cells),
        "like_budgets": cells.like,
        "provenance": provenance_facts(cells.all),
        "paper_objectives": list(cells.paper_objectives),
        "evaluation": evaluation_label(study),
        "accuracy_items": accuracy_items(study),
        "effective_items": effective_items(study),
        "headline": headline_facts(cells),
        "objective_agreement": objective_agreement_facts(cells),
        "movement": movement_facts(cells),
        "spearman": spearman_facts(cells),
        "per_task": per_task_facts(cells),
        "quality": quality_facts(cells),
        "seed_stability": seed_facts(cells),
        "random_prior": prior_facts(cells),
        "cross": cross_facts(cross) if cross else [],
        "cross_provenance": provenance_facts(cross["cells"]) if cross else None,
        "cross_text_seq_len": text_seq_len(cross) if cross else None,
        "calibration_size": size_facts(study, size),
        "audit": audit_facts(study, arms),
    }


# ------------------------------------------------------------------------------------------------- text


def _percent(value: float) -> str:
    return f"{100 * value:.1f} %"


def _list(items: Sequence[str]) -> str:
    items = list(items)
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1] if items else "none"


def setup_text(facts: dict, paper: PaperFacts) -> list[str]:
    summary, n = facts["summary"], facts["num_blocks"]
    calibrations = _list(
        [
            f"{c['objective']} on `{short_data(c['data'])}` "
            f"({c['samples']} instances × {c['seq_len']} tokens)"
            for c in summary["calibrations"]
        ]
    )
    mapping = paper_budgets(n, paper)
    budgets = [
        f"{budget_label(facts, b['drop'])}, {_percent(b['fraction'])} of the blocks" for b in facts["budgets"]
    ]
    missing = [f"{p} (M = {m} for {n} blocks)" for m, p in mapping.items() if m not in facts["like_budgets"]]
    fractions = _list([f"{b} ({_percent(b / paper.blocks)})" for b in paper.budgets])
    text = (
        f"**What was run.** `{facts['model']}` ({n} blocks); calibrations: {calibrations}; searches: "
        f"{', '.join(summary['searches'])}; seeds {', '.join(map(str, summary['seeds']))}"
        + ("; with the random-prior control" if summary.get("random_prior_control") else "")
        + f". Evaluation: suites {', '.join(summary['suites'])}"
        + (
            f", the first {summary['eval_limit']} items or windows per task"
            if summary.get("eval_limit")
            else ", every item"
        )
        + window_cap(summary)
        + f", perplexity windows of {summary['eval_seq_len']} tokens. Accuracy throughout: "
        f"{facts['evaluation']['full']}. The paper removes M = {fractions} of "
        f"{paper.blocks} blocks; for {n} blocks the proportional budgets are M = "
        f"{_list([str(m) for m in mapping])}. Budgets here: {'; '.join(budgets)}. Every comparison with the "
        f"paper below uses the paper's budgets and objectives ({', '.join(facts['paper_objectives'])}) only; "
        "an extension (another budget, or an objective the paper did not run, as task_ce) is reported apart "
        "and labelled."
    )
    if missing:
        text += f" The paper's M = {_list(missing)} was not run."
    if summary["calibrations"] and summary["calibrations"][0]["samples"] < 64:
        text += (
            f" The calibration is {summary['calibrations'][0]['samples']} instances, the paper's 64 × 2048 "
            "tokens is far larger: every disagreement below may shrink with more calibration."
        )
    return [text]


def provenance_text(facts: dict) -> list[str]:
    found = facts["provenance"]
    if found["data_seed_recorded"]:
        draws = (
            "each seed drew its own calibration samples "
            f"(data seeds {', '.join(map(str, found['data_seeds']))})"
            if found["draw_varies_with_seed"]
            else f"every seed used one calibration draw (data seed {found['data_seeds'][0]}, pinned)"
        )
        text = f"**Seeds.** Recorded per cell: {draws}."
    else:
        seeds = ", ".join(map(str, found["data_seeds"])) or "unknown"
        text = (
            "**Seeds.** This study.json records no `data_seed` (it predates the field); the calibration "
            f"seed in the cells' keys is {seeds}"
            + (
                " for every cell: every seed drew the same calibration samples, so the seeds vary the "
                "search only, and the variance of the data draw (what the paper's seeds would capture) is "
                "not measured."
                if not found["draw_varies_with_seed"]
                else "."
            )
        )
    if found["reused"]:
        text += (
            f" {found['reused']} cells copy the first seed's cell (`reused_from`: a deterministic search)."
        )
    if found["truncation_recorded"]:
        text += f" Calibration items truncated to fit: {found['truncated_items']}."
    else:
        text += (
            " `truncated_items` is not recorded: text instances were cut to their first `seq_len` tokens and "
            "longer question prompts lost their beginning; how many items were cut is unknown."
        )
    return [text]


def headline_text(facts: dict) -> list[str]:
    headline = facts["headline"]
    lines = []
    for drop in [*(b["drop"] for b in facts["budgets"])]:
        result = headline["by_drop"][str(drop)]
        verdict = {
            True: "the calibration changes the mask more than the search",
            False: "the search changes the mask more than the calibration",
            None: "undetermined",
        }[result["agrees"]]
        if drop not in facts["like_budgets"]:
            verdict += " (an extension: not compared with the paper)"
        elif result["agrees"] is not None:
            verdict += ", as the paper finds" if result["agrees"] else ": **this disagrees with the paper**"
        lines.append(
            f"{budget_label(facts, drop)}: J across searches {fmt(result['across_searches'])} "
            f"({result['pairs'][0]} pairs{range_text(result['across_searches_seeds'])}), across calibrations "
            f"{fmt(result['across_calibrations'])} ({result['pairs'][1]} pairs"
            f"{range_text(result['across_calibrations_seeds'])}): {verdict}."
        )
    text = (
        "**Does the calibration change the mask more than the search does?** Mean Jaccard of the removal "
        f"sets, the paper's seven searches ({len(headline['seven'])} ran) and objectives "
        f"({', '.join(facts['paper_objectives'])}), same M and seed: " + " ".join(lines)
    )
    with_ce = headline["with_task_ce"]
    if with_ce != (
        headline["by_drop"]["like"]["across_searches"],
        headline["by_drop"]["like"]["across_calibrations"],
    ):
        text += (
            f" With task_ce (an extension) as a third calibration, the paper's budgets: J across searches "
            f"{fmt(with_ce[0])}, across calibrations {fmt(with_ce[1])}."
        )
    for values, where in (
        (headline["per_cell_search_j"], "on the paper's budgets and objectives"),
        (headline["per_cell_search_j_extensions"], "in the extensions"),
    ):
        values = [j for j in values if not math.isnan(j)]
        if values:
            text += (
                f" Per cell (configuration, M, seed) {where} the seven's pairwise J ranges "
                f"{fmt(min(values))}–{fmt(max(values))} over {len(values)} cells."
            )
    paragraphs = [text]
    if headline["baselines"]:
        values = ", ".join(f"{s} {fmt(j, 2)}" for s, j in headline["baselines"].items())
        paragraphs.append(
            "**The objective-blind baselines, apart.** They choose from hidden states, not from the "
            "calibration loss, so they are no part of the comparison above. J of one baseline's masks across "
            f"calibrations, the paper's budgets and objectives: {values}. Pooled with the seven they would "
            f"read J across searches {fmt(headline['with_baselines'][0])}, across calibrations "
            f"{fmt(headline['with_baselines'][1])}."
        )
    return paragraphs


def _configuration_label(row: dict, paper: PaperFacts) -> str:
    """The configuration, ``(an extension: not in the paper)`` after an objective the paper did not run."""
    return row["configuration"] + objective_label(row["objective"], paper)[len(row["objective"]) :]


def quality_text(facts: dict, paper: PaperFacts) -> list[str]:
    rows = facts["quality"]
    table = [
        "| configuration | M | variants | ppl (geometric mean) | σ² log ppl | σ² acc (points²) "
        "| binomial floor (points²) | acc mean (best, worst) "
        "| lowest calibration loss: search (seed), ppl, acc |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        search, seed, ppl, acc = r["lowest_loss"]
        table.append(
            f"| {_configuration_label(r, paper)} | {budget_label(facts, r['drop'])} | {r['variants']} | "
            f"{fmt(r['ppl_geomean'], 1)} | {fmt(r['log_ppl_variance'], 3)} | {fmt(r['acc_variance'], 1)} | "
            f"{fmt(r['acc_floor'], 1)} | {fmt(r['acc_mean'], 1)} ({fmt(r['acc_best'], 1)}, "
            f"{fmt(r['acc_worst'], 1)}) | {search} ({seed}), {fmt(ppl, 1)}, {fmt(acc, 1)} |"
        )
    intro = (
        f"**Quality of the seven's variants** (single-block prior, seeds pooled; accuracy: "
        f"{facts['evaluation']['full']}). Perplexity is summarised on the log scale (geometric mean; σ² of "
        "log perplexity across the seven of a cell, mean over seeds), where a spread means the same at any "
        "perplexity; σ² of accuracy across the seven in points², as the paper, beside its binomial floor "
        "p(1 − p)/n at the cell's mean accuracy (mean over seeds): the variance one n-item measurement has "
        "by chance, so a σ² near it is no disagreement between the searches."
    )
    paragraphs = [intro, "\n".join(table)]
    nine = next((m for m, p in paper_budgets(facts["num_blocks"], paper).items() if p == 9), None)
    margin = [r for r in rows if r["objective"] == "task_margin" and r["drop"] == nine]
    if margin:
        found, floor = margin[0]["acc_variance"], margin[0]["acc_floor"]
        above = found / floor if floor else math.nan
        paragraphs.append(
            f"The paper's σ² of accuracy for LLaMA3 under the margin at M = 9 is {paper.variance_margin_m9} "
            f"points²; here, the margin at M = {nine}: {fmt(found, 1)} points²"
            + (f", {above:.1f}× its binomial floor of {fmt(floor, 1)}" if not math.isnan(above) else "")
            + (
                ": far more spread between the searches than the paper's, and more than chance alone gives "
                "(**a disagreement**)."
                if found > 10 * paper.variance_margin_m9 and (math.isnan(above) or above > 2)
                else ": no more than chance gives on this many items, so not a disagreement this accuracy "
                "can show."
                if not math.isnan(above)
                else "."
            )
        )
    return paragraphs + premise_text(facts, paper)


def premise_text(facts: dict, paper: PaperFacts) -> list[str]:
    """Each task objective against perplexity calibration at each paper budget: the accuracy gap (per-seed
    range beside) and the perplexity ratio, held to the premise of trading perplexity for accuracy."""
    rows, paragraphs = facts["quality"], []
    for drop in facts["like_budgets"]:
        at = [r for r in rows if r["drop"] == drop]
        for task in (r for r in at if get_objective(r["objective"]).data_kind == MULTIPLE_CHOICE):
            for plain in (r for r in at if r["objective"] == "perplexity"):
                gap = task["acc_mean"] - plain["acc_mean"]
                seeds = sorted(set(task["acc_mean_by_seed"]) & set(plain["acc_mean_by_seed"]))
                gaps = seed_range([task["acc_mean_by_seed"][s] - plain["acc_mean_by_seed"][s] for s in seeds])
                ratio = task["ppl_geomean"] / plain["ppl_geomean"]
                paragraphs.append(
                    f"At {budget_label(facts, drop)} the variants of {_configuration_label(task, paper)} are "
                    f"{abs(gap):.1f} points {'more' if gap > 0 else 'less'} accurate on average than those "
                    f"of {plain['configuration']}"
                    + (f" (per seed {gaps[0]:+.1f} to {gaps[1]:+.1f})" if gaps else "")
                    + f", at {ratio:,.1f}× the perplexity (geometric means)"
                    + (
                        f": {task['objective']} did not buy accuracy here, **against the premise of task "
                        "calibration** (trading perplexity for task accuracy)."
                        if gap <= 0
                        else f": {task['objective']} bought accuracy with perplexity, the premise of task "
                        "calibration."
                    )
                )
    return paragraphs


def seeds_text(facts: dict) -> list[str]:
    found = facts["seed_stability"]
    if len(facts["summary"]["seeds"]) < 2:
        return []
    changed = sorted(found["changed"].items())
    if not facts["provenance"]["draw_varies_with_seed"]:
        listed = "; ".join(f"{s} ({c}, M = {m}): {k} masks" for (c, m, s), k in changed)
        return [
            f"**Seed stability.** {len(changed)} of {found['groups']} (configuration, M, search) found more "
            f"than one mask over the seeds with the calibration draw fixed: {listed or 'none'}."
        ]
    by_drop = facts["headline"]["by_drop"]
    sentences = []
    for row in found["across_draws"]:
        headline = by_drop.get(str(row["drop"]), {})
        compared = (
            f" (across searches within a draw {fmt(headline['across_searches'])}, across calibrations "
            f"{fmt(headline['across_calibrations'])}{_draw_verdict(row['seven'], headline)})"
            if headline and row["seven_pairs"]
            else ""
        )
        sentences.append(
            f"{budget_label(facts, row['drop'])}: J across draws {fmt(row['seven'])} for the seven "
            f"({row['seven_pairs']} pairs){compared}, {fmt(row['baselines'])} for the baselines"
        )
    return [
        "**The calibration draw (what the seeds vary).** Each seed draws its own calibration samples, so one "
        "search's masks under one configuration differ across seeds by the draw (and, for a stochastic "
        f"search, its seed): {len(changed)} of {found['groups']} (configuration, M, search) found more than "
        "one mask. Mean Jaccard of one search's masks across the draws, against the headline's: "
        + "; ".join(sentences)
        + "."
    ]


def _draw_verdict(across_draws: float, headline: dict) -> str:
    """``: the draw moves the mask more than the search, less than the calibration`` (a lower J: more)."""
    parts = []
    for name, value in (
        ("the search", headline["across_searches"]),
        ("the calibration", headline["across_calibrations"]),
    ):
        if math.isnan(value) or math.isnan(across_draws) or value == across_draws:
            continue
        parts.append(f"{'more' if across_draws < value else 'less'} than {name}")
    return f": the draw moves the mask {', '.join(parts)}" if parts else ""


def prior_text(facts: dict) -> list[str]:
    rows = facts["random_prior"]
    if not rows:
        return []
    table = [
        "| configuration | M | search | seeds | Δ loss (random − prior) | ppl prior → random | "
        "acc prior → random | same mask |",
        "|---|---|---|---|---|---|---|---|",
    ]
    table += [
        f"| {r['configuration']} | {budget_label(facts, r['drop'])} | {r['search']} | {r['seeds']} | "
        f"{r['loss_change']:+.4f} | {fmt(r['ppl'][0], 1)} → {fmt(r['ppl'][1], 1)} | "
        f"{fmt(r['acc'][0], 1)} → {fmt(r['acc'][1], 1)} | {r['same_mask']}/{r['seeds']} |"
        for r in rows
    ]
    return [
        "**Random-prior control (an extension: the paper has none).** The prior-guided searches with a "
        "seeded "
        "random ranking instead of the single-block scores, against the same search and seed with the prior "
        "(perplexity as geometric means over the seeds).",
        "\n".join(table),
    ]


def caveats_text(facts: dict) -> list[str]:
    limit = facts["effective_items"]
    if not limit:
        return []
    note = " (the mean over its tasks as one binomial)" if len(facts["accuracy_items"]) > 1 else ""
    accuracy = [r["acc_mean"] for r in facts["quality"]]
    share = statistics.fmean(accuracy) / 100 if accuracy else 0.5
    error = 100 * math.sqrt(share * (1 - share) / limit)
    return [
        f"**Precision.** Each accuracy is measured on {limit:.0f} items{note}: at the "
        "variants' mean accuracy "
        f"({100 * share:.0f} %) one standard error is {error:.1f} points, so two variants differing by less "
        f"than {2 * math.sqrt(2) * error:.0f} points (two standard errors of a difference) are not "
        "distinguishable; averages over many variants are."
    ]


def render_reading(facts: dict, paper: PaperFacts = PAPER) -> str:
    """The reading (Markdown) from :func:`reading_facts`: every number from there, none typed."""
    paragraphs = [
        "*Generated by `python -m benchmarks.study_reading` from `study.json` (pruning/study/reading.py): "
        "every number below is computed, none typed.*",
        *setup_text(facts, paper),
        *provenance_text(facts),
        *headline_text(facts),
        *objective_agreement_text(facts, paper),
        *movement_text(facts, paper),
        *spearman_text(facts, paper),
        *audit_text(facts),
        *per_task_text(facts, paper),
        *quality_text(facts, paper),
        *seeds_text(facts),
        *prior_text(facts),
        *cross_text(facts),
        *size_text(facts),
        *caveats_text(facts),
    ]
    return "\n\n".join(paragraphs) + "\n"


def write_reading(out, cross=None, size=None, arms=()) -> str:
    """Generate ``out/reading.md`` from ``out/study.json`` (and ``cross/study.json``) and re-render the
    report's ``README.md`` and ``report.html`` around it; figures and ``study.json`` stay as they are.

    Raises:
        UserError: no study.json, or a report with healing sections (re-run the study to render those).
    """
    import json

    from ground.core.errors import UserError
    from pruning.study.cells import CellResult
    from pruning.study.report import render_html, render_markdown
    from pruning.study.tables import build_sections, model_name

    out = Path(out)
    path = out / "study.json"
    if not path.is_file():
        raise UserError(f"{path} not found: give a study report directory")
    study = json.loads(path.read_text())
    cross_study = json.loads((Path(cross) / "study.json").read_text()) if cross else None
    size_study = json.loads((Path(size) / "study.json").read_text()) if size else None
    arm_studies = [json.loads((Path(arm) / "study.json").read_text()) for arm in arms or ()]
    if "healing" in study:  # refused before anything is written
        raise UserError(f"{out} has healing sections: run the study again to render the report with them")
    reading = render_reading(reading_facts(study, cross_study, size_study, arm_studies))
    (out / "reading.md").write_text(reading)
    fields = set(CellResult.__dataclass_fields__)
    cells = [CellResult(**{k: v for k, v in row.items() if k in fields}) for row in study["cells"]]
    sections, _ = build_sections(study["summary"], cells, study["dense"])
    title = f"Depth-pruning study: {model_name(study['summary'])}"
    (out / "README.md").write_text(render_markdown(title, sections, reading))
    (out / "report.html").write_text(render_html(title, sections, reading))
    return reading
