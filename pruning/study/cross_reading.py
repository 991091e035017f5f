"""The cross-controls' part of a study's reading: one search's masks under two calibration configurations
(seed 0), the paper's seven apart from the objective-blind baselines, with what changes between the two (the
data, the objective on the same items, the objective on the same items written as text, or both) and what
each configuration saw (its draw, and whether any item was cut)."""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from itertools import combinations
from pathlib import Path

from pruning.study import statistics as study_stats
from pruning.study.reading_basis import STUDY_SEARCHES, budget_label, configuration
from pruning.study.tables import fmt, short_data


def _objective_change(first: str, second: str) -> str:
    """``objective`` when one data spec is a text file of the other's items written out (named after it, as
    ``text:pydoc-cloze-as-text.jsonl`` after ``pydoc-cloze``), else ``both`` (objective and data)."""
    for file, other in ((first, second), (second, first)):
        prefix, _, name = file.partition(":")
        if prefix == "text" and ":" not in other and Path(name).stem.startswith(other):
            return "objective"
    return "both"


def cross_facts(cross: dict) -> list[dict]:
    """Same search, two configurations (seed 0): mean Jaccard over the seven and over the baselines apart,
    with what changes between the two (the data: same objective; else the objective, and the data spec)."""
    main = [
        c
        for c in cross["cells"]
        if c["prior"] == "single_block" and c["seed"] == min(x["seed"] for x in cross["cells"])
    ]
    by_key = {(configuration(c), c["drop"], c["search"]): c for c in main}
    objective_of = {configuration(c): c["objective"] for c in main}
    data_of = {configuration(c): short_data(c["data"]) for c in main}
    names = sorted(objective_of)
    rows = []
    for first, second in combinations(names, 2):
        if objective_of[first] == objective_of[second]:
            changes = "data"
        elif data_of[first] == data_of[second]:
            changes = "objective_only"
        else:
            changes = _objective_change(data_of[first], data_of[second])
        for drop in sorted({c["drop"] for c in main}):
            row = {"first": first, "second": second, "changes": changes, "drop": drop}
            for group, searches in (("seven", STUDY_SEARCHES), ("baselines", None)):
                values = [
                    study_stats.jaccard(
                        by_key[first, drop, s]["removed_blocks"], by_key[second, drop, s]["removed_blocks"]
                    )
                    for s in sorted({c["search"] for c in main})
                    if (searches is None) != (s in STUDY_SEARCHES)
                    and (first, drop, s) in by_key
                    and (second, drop, s) in by_key
                ]
                row[group] = statistics.fmean(values) if values else math.nan
            rows.append(row)
    return rows


def text_seq_len(study: dict) -> int | None:
    """The tokens a text instance keeps in ``study``'s text calibrations (None: no text file calibration)."""
    calibrations = study.get("summary", {}).get("calibrations", [])
    lengths = {c["seq_len"] for c in calibrations if str(c["data"]).startswith("text:")}
    return lengths.pop() if len(lengths) == 1 else None


def cross_text(facts: dict) -> list[str]:
    rows = facts["cross"]
    if not rows:
        return []
    table = [
        "| configuration A | configuration B | what changes | M | J same search, the seven | J, baselines |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        changes = {
            "data": "the data",
            "objective": "the objective (the same source items as text)",
            "objective_only": "the objective only (the same items)",
            "both": "the objective and the data",
        }[r["changes"]]
        table.append(
            f"| {r['first']} | {r['second']} | {changes} | {budget_label(facts, r['drop'])} | "
            f"{fmt(r['seven'])} | {fmt(r['baselines'])} |"
        )
    found = facts["cross_provenance"] or {}
    draw = (
        f"data seed {', '.join(map(str, found['data_seeds']))}"
        if found.get("data_seed_recorded")
        else "an earlier protocol: it records no `data_seed`"
    )
    paragraphs = [
        f"**Cross-controls** (seed 0, {draw}, single-block prior): mean Jaccard of one search's masks under "
        "two configurations, the paper's seven apart from the objective-blind baselines.",
        "\n".join(table),
    ]
    for drop in sorted({r["drop"] for r in rows}):
        by_change = defaultdict(list)
        for r in rows:
            if r["drop"] == drop:
                by_change[r["changes"]].append(r["seven"])
        objective_kinds = [kind for kind in ("objective", "objective_only") if kind in by_change]
        if "data" in by_change and objective_kinds:
            data = statistics.fmean(by_change["data"])
            means = {kind: statistics.fmean(by_change[kind]) for kind in objective_kinds}
            said = {
                "objective": "when the objective changes (and the tokens seen, below)",
                "objective_only": "when only the objective changes (the same items)",
            }
            if all(value < data for value in means.values()):
                verdict = "the objective moves the mask more"
            elif all(value > data for value in means.values()):
                verdict = "the data moves the mask more"
            else:
                verdict = "neither moves the mask more in every pair"
            paragraphs.append(
                f"{budget_label(facts, drop)}, the seven: J = {fmt(data)} when the data changes, "
                + ", ".join(f"{fmt(value)} {said[kind]}" for kind, value in means.items())
                + f": {verdict}."
            )
    if not any(r["changes"] == "objective" for r in rows):
        return paragraphs
    if found.get("truncation_recorded") and not found.get("truncated_items"):
        seq_len = facts.get("cross_text_seq_len")
        kept = f"its first {seq_len} tokens" if seq_len else "its first `seq_len` tokens"
        cut = f"a text instance keeps {kept} while every question is scored whole (no item was truncated)"
    else:
        cut = (
            "a long item is cut at opposite ends (a text instance keeps its first `seq_len` tokens, a "
            "question its last tokens before the answer)"
            + ("" if found.get("truncation_recorded") else "; these cells do not record how many were cut")
        )
    return paragraphs + [
        "An objective of another data kind always reads another data spec. Where a text file holds the "
        "questions written out as text (the SmolLM2 study's cloze items as text), the two objectives share "
        "the source items but not the text they saw: each drew its items independently, and "
        f"{cut}, so that pair changes the objective *and* the tokens seen.",
    ]
