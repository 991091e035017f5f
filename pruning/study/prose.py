"""The committed SmolLM2 study's paragraph of docs/study.md, generated from the JSON (issue 55 item 7).

Every count and figure the paragraph quotes comes from :func:`pruning.study.reading.reading_facts` of the
committed ``study.json`` files, so no number in the prose can go stale: ``tests/test_committed_study.py``
renders it again and compares it with the file, between the :data:`BEGIN` and :data:`END` markers.

    .venv/bin/python -m benchmarks.study_reading docs/study-smollm2-135m --prose docs/study.md   # rewrite it
"""

from __future__ import annotations

from pathlib import Path

from pruning.study.reading_basis import STUDY_SEARCHES
from pruning.study.tables import fmt

BEGIN = "<!-- generated: the SmolLM2 study's figures (pruning/study/prose.py) -->"
END = "<!-- end of generated -->"


def _interval(metrics: dict, task: str, metric: str) -> str:
    value, (low, high) = metrics[f"{task}/{metric}"], metrics[f"{task}/{metric}_ci95"]
    return f"{100 * value:.0f} % [{100 * low:.0f}, {100 * high:.0f}]"


def _seeds(found) -> str:
    return f"seeds {found[0]:.3f}–{found[1]:.3f}" if found else "one seed"


def _counts(study: dict) -> str:
    cells = study["cells"]
    masks = {tuple(sorted(c["removed_blocks"])) for c in cells}
    devices = sorted({c.get("search_device") or "not recorded" for c in cells})
    by_device = {d: sum((c.get("search_device") or "not recorded") == d for c in cells) for d in devices}
    where = ", ".join(f"{count} on {device}" for device, count in by_device.items())
    dense = study["dense"]
    matched = "evaluations" in (study["summary"].get("options") or {}).get("cbo", {})
    cbo = (
        "CBO at greedy's budget of subset evaluations"
        if matched
        else "CBO at its default of 10 re-ranked states (its rerun at greedy's budget: `benchmarks/"
        "study_smollm2.sh round5`)"
    )
    return (
        f"{len(cells)} cells ({where}), {cbo}; every cell is judged on the offline suite's "
        "independent yardstick, each figure with its n and 95 % interval: pydoc-cloze accuracy (200 "
        "items, in-domain for the perplexity objective: built from pydoc, its calibration source) and "
        "GCIDE-define accuracy (200 items, built from no calibration corpus), pydoc and GCIDE perplexity "
        "(32 windows of 128 tokens); "
        f"dense scores {_interval(dense, 'pydoc_cloze', 'acc_norm')} and "
        f"{_interval(dense, 'gcide_define', 'acc')}. Its {len(masks)} distinct masks are judged from the "
        "dense weights with shared prefixes (`pruning/evaluation/mask_set.py`)."
    )


def _paper_comparison(facts: dict) -> str:
    head = facts["headline"]["by_drop"]["8"]
    draws = next(r for r in facts["seed_stability"]["across_draws"] if r["drop"] == 8)
    like = facts["movement"]["like"]
    audit = facts["audit"]
    low, high = audit["movement_like"]["ci95"]
    tasks = {row["task"]: row["movement"]["ratio"] for row in facts["per_task"]}
    signs = facts["spearman"]["by_objective"]
    return (
        "On the paper's budgets and objectives (perplexity, the margin): at M = 8 the seven searches agree "
        f"less across the two calibrations than across searches (Jaccard {fmt(head['across_calibrations'])} "
        f"against {fmt(head['across_searches'])}; {_seeds(head['across_calibrations_seeds'])} and "
        f"{_seeds(head['across_searches_seeds'])}), as the paper finds, and a new calibration draw moves "
        f"the mask between the two ({fmt(draws['seven'])}). A change of calibration moves the mean accuracy "
        f"of the two tasks {like['ratio']:.2f}× (95 % bootstrap interval over seeds and searches {low:.2f}–"
        f"{high:.2f}; {like['configuration_mean']:.1f} against {like['search_mean']:.1f} points) what a "
        f"change of search does, against the paper's 1.11, and so on each task alone (pydoc-cloze "
        f"{tasks['pydoc_cloze']:.2f}, GCIDE-define {tasks['gcide_define']:.2f}). Per objective, the per-cell "
        "Spearman ρ of perplexity rank and accuracy rank is positive in "
        f"{signs['perplexity']['positive']} of {signs['perplexity']['cells']} cells under perplexity (the "
        f"paper: negative in 5 of 6) and in {signs['task_margin']['positive']} of "
        f"{signs['task_margin']['cells']} under the margin (the paper: positive in 6 of 6)."
    )


def _audit(facts: dict) -> str:
    audit = facts["audit"]
    rows = {(r["configuration"], r["drop"]): r for r in audit["budgets"]["variance"]}
    plain = rows[("perplexity on pydoc", 8)]
    failing = ", ".join(f"{s} in {k} of {plain['cells']}" for s, k in plain["failing"].items()) or "none"
    evaluations = audit["budgets"]["per_search"]
    spent = ", ".join(f"{s} {evaluations[s]['median']:.0f}" for s in STUDY_SEARCHES if s in evaluations)
    beating = {r["objective"]: r for r in audit["beating_dense"]}
    ce, margin = beating["task_ce"], beating["task_margin"]
    quality = {(r["objective"], r["drop"]): r for r in facts["quality"]}
    gap = {
        objective: quality[("perplexity", 8)]["acc_mean"] - quality[(objective, 8)]["acc_mean"]
        for objective in ("task_ce", "task_margin")
    }
    return (
        f"Subset evaluations per search (median over cells): {spent}. Under perplexity at M = 8 σ² of "
        f"accuracy across the seven is {fmt(plain['variance'], 1)} points² with every search and "
        f"{fmt(plain['variance_without_failing'], 1)} without those whose set scores worse on the "
        f"calibration loss than one_shot's ({failing}), against a binomial floor of "
        f"{fmt(plain['floor'], 1)}. Calibrated on 4 questions the task objectives overfit: "
        f"{ce['below_dense']} of {ce['variants']} task_ce variants and {margin['below_dense']} of "
        f"{margin['variants']} margin variants score better than dense on their own calibration loss "
        f"(median test perplexity {fmt(ce['median_ppl'], 0)} and {fmt(margin['median_ppl'], 0)}), and at "
        f"M = 8 they are {gap['task_ce']:.1f} and {gap['task_margin']:.1f} points less accurate than "
        "perplexity calibration's variants: the §5.2 ratio above measures that collapse as much as the "
        "paper's question, and holds for this regime only."
    )


def _ratio(movement: dict) -> str:
    """A §5.2 ratio with its bootstrap interval when it has one."""
    low_high = movement["ci95"]
    return f"{movement['ratio']:.2f}" + (f" [95 % {low_high[0]:.2f}, {low_high[1]:.2f}]" if low_high else "")


def _arms(facts: dict) -> str:
    parts = []
    size = facts.get("calibration_size") or {}
    for row in size.get("rows", []) if size.get("comparable") else []:
        parts.append(
            f"{row['objective']} on {row['samples'][1]} questions {row['arm']['acc']:.1f} % "
            f"({row['samples'][0]} questions: {row['study']['acc']:.1f} %)"
        )
    text = ""
    if parts:
        plain = size["rows"][0]["perplexity"]["acc"]
        text += (
            f"The calibration-size arm (M = 8, seed 0): {'; '.join(parts)}, against perplexity calibration's "
            f"{plain:.1f} %."
        )
    for arm in facts["audit"].get("arms", []):
        movement, beating = arm["movement"], arm["beating_dense"]
        pair = arm.get("movement_with_perplexity")  # its task_margin against perplexity: the paper's pair
        text += (
            f" The arm of {'/'.join(map(str, arm['questions']))} questions (task_margin clipped at ±1, "
            f"task_ce; seeds {', '.join(map(str, movement['seeds']))}): §5.2 ratio {_ratio(movement)} "
            "between its two objectives"
            + (f", {_ratio(pair)} between its task_margin and perplexity calibration" if pair else "")
            + "; variants below dense on their calibration loss: "
            + ", ".join(f"{r['objective']} {r['below_dense']} of {r['variants']}" for r in beating)
            + "."
        )
    return text.strip()


def study_paragraph(study: dict, facts: dict) -> str:
    """The SmolLM2 study's paragraph (Markdown, wrapped at 110 columns) from its ``study.json`` and its
    reading's facts (:func:`pruning.study.reading.reading_facts`, with the calibration-size arm and arms)."""
    import textwrap

    text = " ".join(
        part
        for part in (
            "The committed SmolLM2-135M study:",
            _counts(study),
            _paper_comparison(facts),
            _audit(facts),
            _arms(facts),
        )
        if part
    )
    return "\n".join(textwrap.wrap(text, width=110, break_on_hyphens=False, break_long_words=False))


def replace_generated(document: str, paragraph: str) -> str:
    """``document`` with the text between :data:`BEGIN` and :data:`END` replaced by ``paragraph``."""
    start, end = document.index(BEGIN) + len(BEGIN), document.index(END)
    return document[:start] + "\n" + paragraph + "\n" + document[end:]


def write_prose(path: Path, study: dict, facts: dict) -> None:
    """Rewrite ``path``'s generated paragraph from ``study`` and its ``facts``."""
    path.write_text(replace_generated(path.read_text(), study_paragraph(study, facts)))
