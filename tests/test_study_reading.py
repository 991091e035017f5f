"""The generated reading's like-for-like rules on a synthetic study.json whose answers are known by hand
(issue 29, rule 2): the paper's seven apart from the baselines, the paper's budgets apart from extensions,
means with means, per-cell signs beside the pooled ρ, variance on log perplexity, what the data lacks."""

from __future__ import annotations

import math

import pytest

from pruning.study.reading import STUDY_SEARCHES, paper_budgets, reading_facts, render_reading

CONFIGURATIONS = (("perplexity", "text-a"), ("task_margin", "qa-b"))


def metrics(ppl: float, acc: float) -> dict:
    return {"wikitext2/perplexity": ppl, "hellaswag/acc_norm": acc / 100}


def cell(objective, data, drop, search, mask, ppl, acc, seed=0, **extra) -> dict:
    key = f"{objective}|{data}|4|32|{extra.pop('draw', 0)}|documents|m{drop}|{search}|seed{seed}|single_block"
    return {
        "key": key, "objective": objective, "data": data, "drop": drop, "search": search, "seed": seed,
        "prior": "single_block", "removed_blocks": sorted(mask), "calibration_loss": float(len(search)),
        "metrics": metrics(ppl, acc), **extra,
    }  # fmt: skip


def synthetic_study(**extra) -> dict:
    """32 blocks, M = 9 (the paper's) and 12 (an extension), the seven plus streamline, one seed.

    M = 9: every search removes {0..8} under perplexity and {20..28} under the margin (J across searches 1,
    across calibrations 0: the paper's direction); accuracy 80 + i and 70 + i for the i-th search; perplexity
    10·2^i under perplexity (ρ = −1) and 10·2^(6−i) under the margin (ρ = +1). M = 12: search i removes
    {i..i+11} under both calibrations (across calibrations 1: the opposite direction), ρ = +1 in both cells.
    streamline removes {10..9+M} everywhere (it would change the seven's numbers if it were counted).
    """
    cells = []
    for objective, data in CONFIGURATIONS:
        margin = objective == "task_margin"
        for i, search in enumerate(STUDY_SEARCHES):
            ppl9 = 10 * 2 ** (6 - i if margin else i)
            mask9 = range(20, 29) if margin else range(9)
            cells.append(cell(objective, data, 9, search, mask9, ppl9, (70 if margin else 80) + i, **extra))
            cells.append(
                cell(objective, data, 12, search, range(i, i + 12), 10 * 2 ** (6 - i), 60 + i, **extra)
            )
        for drop in (9, 12):
            cells.append(cell(objective, data, drop, "streamline", range(10, 10 + drop), 50, 50, **extra))
    summary = {
        "model": "/m/synthetic", "model_name": "synthetic", "num_blocks": 32, "drops": [9, 12],
        "objectives": ["perplexity", "task_margin"], "searches": [*STUDY_SEARCHES, "streamline"],
        "seeds": [0],
        "random_prior_control": False, "suites": ["all"], "engine": "torch", "eval_limit": None,
        "eval_seq_len": 2048,
        "calibrations": [
            {"objective": o, "data": d, "samples": 4, "seq_len": 32, "sampling": "documents"}
            for o, d in CONFIGURATIONS
        ],
    }  # fmt: skip
    return {
        "summary": summary,
        "dense": metrics(8, 85),
        "average_perplexity_tasks": ["wikitext2"],
        "accuracy_metrics": {"hellaswag": "acc_norm"},
        "cells": cells,
    }


def test_paper_budgets_by_fraction_of_blocks():
    assert paper_budgets(32) == {7: 7, 9: 9}
    assert paper_budgets(30) == {7: 7, 8: 9}  # 6.56 and 8.44
    assert paper_budgets(36) == {8: 7, 10: 9}


@pytest.fixture(scope="module")
def facts():
    return reading_facts(synthetic_study())


def test_budgets_compared_with_the_paper_and_extensions(facts):
    assert facts["like_budgets"] == [9]
    assert [(b["drop"], b["paper"]) for b in facts["budgets"]] == [(9, 9), (12, None)]


def test_headline_over_the_seven_with_baselines_apart(facts):
    headline = facts["headline"]
    assert headline["seven"] == list(STUDY_SEARCHES)
    at9, at12 = headline["by_drop"]["9"], headline["by_drop"]["12"]
    assert (at9["across_searches"], at9["across_calibrations"], at9["agrees"]) == (1.0, 0.0, True)
    assert at9["pairs"] == (2 * 21, 7)  # 21 search pairs per calibration; streamline in none
    assert at12["across_calibrations"] == 1.0 and at12["agrees"] is False
    assert headline["by_drop"]["like"] == at9  # only M = 9 is the paper's
    assert headline["baselines"] == {"streamline": 1.0}
    # pooled, streamline's 7 disjoint pairs per calibration and its identical pair change both numbers
    assert headline["with_baselines"] == (pytest.approx(42 / 56), pytest.approx(1 / 8))


def test_accuracy_movement_is_mean_with_mean_on_the_papers_budgets(facts):
    like = facts["movement"]["like"]
    assert like["configuration_mean"] == pytest.approx(10.0)
    assert like["search_mean"] == pytest.approx(56 / 21)  # mean |i − j| over the 21 pairs of 0..6
    assert like["pairs"] == (7, 42)
    assert facts["movement"]["all"]["pairs"] == (14, 84)  # the extension counted only there


def test_spearman_signs_per_cell_beside_the_pooled_rho(facts):
    spearman = facts["spearman"]
    assert {(r["configuration"], r["drop"]): round(r["rho"], 6) for r in spearman["cells"]} == {
        ("perplexity on text-a", 9): -1.0,
        ("task_margin on qa-b", 9): 1.0,
        ("perplexity on text-a", 12): 1.0,
        ("task_margin on qa-b", 12): 1.0,
    }
    assert spearman["by_objective"] == {
        "perplexity": {"positive": 0, "negative": 1, "zero": 0, "undefined": 0, "cells": 1},
        "task_margin": {"positive": 1, "negative": 0, "zero": 0, "undefined": 0, "cells": 1},
    }
    assert spearman["all"]["positive"] == 3
    assert -1 < spearman["pooled"] < 1


def test_perplexity_spread_is_taken_on_log_perplexity(facts):
    rows = {(r["configuration"], r["drop"]): r for r in facts["quality"]}
    plain = rows["perplexity on text-a", 9]
    assert plain["log_ppl_variance"] == pytest.approx(4 * math.log(2) ** 2)  # σ²(0..6) = 4
    assert plain["ppl_geomean"] == pytest.approx(80.0)  # 10 · 2^mean(0..6)
    assert plain["acc_variance"] == pytest.approx(4.0) and plain["variants"] == 7


def test_the_text_states_extensions_disagreements_and_missing_fields(facts):
    text = render_reading(facts)
    assert "M = 12 (extension)" in text and "M = 9 (≈ the paper's 9)" in text
    assert "the paper: 2.06 and 1.85 points" in text
    # §5.3 per objective, each beside the paper's count for that objective
    assert (
        "perplexity: ρ positive in 0 of 1 cells, negative in 1; the paper: negative in 5 of 6: **an agr"
        in text
    )
    assert (
        "task_margin: ρ positive in 1 of 1 cells, negative in 0; the paper: positive in 6 of 6: **an agr"
        in text
    )
    assert "is not quoted as agreement" in text
    # the paper's budget is compared with the paper; the extension's opposite direction is not
    assert (
        "across calibrations 0.000 (7 pairs): the calibration changes the mask more than the search, as "
        in text
    )
    assert "the search changes the mask more than the calibration (an extension: not compared" in text
    assert "records no `data_seed`" in text and "`truncated_items` is not recorded" in text
    assert "The paper's M = 7 (M = 7 for 32 blocks) was not run" in text


def test_recorded_seeds_and_truncation_are_reported():
    facts = reading_facts(synthetic_study(data_seed=3, truncated_items=2, draw=3))
    provenance = facts["provenance"]
    assert provenance["data_seed_recorded"] and provenance["data_seeds"] == [3]
    assert provenance["truncated_items"] == 2 * len(synthetic_study()["cells"])
    text = render_reading(facts)
    assert "data seed 3, pinned" in text and "Calibration items truncated to fit: " in text


def test_cross_controls_name_what_changes_and_keep_baselines_apart():
    specs = (
        ("perplexity", "pydoc"),
        ("perplexity", "text:/d/pydoc-cloze-as-text.jsonl"),
        ("task_margin", "pydoc-cloze"),
    )
    cells = [
        cell(objective, data, 9, search, range(9) if search != "streamline" else range(n, n + 9), 10, 80)
        for n, (objective, data) in enumerate(specs)
        for search in (*STUDY_SEARCHES, "streamline")
    ]
    facts = reading_facts(synthetic_study(), {"cells": cells})
    rows = {(r["first"], r["second"]): r for r in facts["cross"]}
    assert {pair: r["changes"] for pair, r in rows.items()} == {
        ("perplexity on pydoc", "perplexity on text:pydoc-cloze-as-text.jsonl"): "data",
        ("perplexity on pydoc", "task_margin on pydoc-cloze"): "both",
        ("perplexity on text:pydoc-cloze-as-text.jsonl", "task_margin on pydoc-cloze"): "objective",
    }
    assert all(r["seven"] == 1.0 for r in rows.values())
    assert rows["perplexity on pydoc", "task_margin on pydoc-cloze"]["baselines"] == pytest.approx(7 / 11)


def test_cross_controls_of_one_data_spec_change_only_the_objective_and_say_what_each_saw():
    specs = (
        ("perplexity", "pydoc", 32),
        ("perplexity", "text:/d/pydoc-cloze-as-text.jsonl", 32),
        ("task_margin", "pydoc-cloze", 128),
        ("task_ce", "pydoc-cloze", 128),
    )
    masks = {"pydoc": range(9), "text": range(1, 10), "task_margin": range(3, 12), "task_ce": range(20, 29)}

    def mask(objective, data):
        return masks.get(objective) or masks["text" if data.startswith("text:") else "pydoc"]

    def cross(**recorded):
        cells = [
            cell(objective, data, 9, search, mask(objective, data), 10, 80, **recorded)
            for objective, data, _ in specs
            for search in STUDY_SEARCHES
        ]
        summary = {
            "calibrations": [{"objective": o, "data": d, "seq_len": n} for o, d, n in specs],
        }
        return {"summary": summary, "cells": cells}

    facts = reading_facts(synthetic_study(), cross(data_seed=5, truncated_items=0, draw=5))
    rows = {(r["first"], r["second"]): r for r in facts["cross"]}
    assert rows["task_ce on pydoc-cloze", "task_margin on pydoc-cloze"]["changes"] == "objective_only"
    assert rows["task_ce on pydoc-cloze", "task_margin on pydoc-cloze"]["seven"] == 0.0
    assert rows["perplexity on pydoc", "perplexity on text:pydoc-cloze-as-text.jsonl"]["seven"] == 0.8
    text = render_reading(facts)
    assert "the objective only (the same items)" in text and "(seed 0, data seed 5," in text
    # data: J 0.8; objective via text: J(1..9, 3..11) = 7/11 and J(1..9, 20..28) = 0; objective only: 0
    assert "J = 0.800 when the data changes, 0.318 when the objective changes" in text
    assert "0.000 when only the objective changes (the same items): the objective moves the mask more" in text
    assert "a text instance keeps its first 32 tokens while every question is scored whole" in text

    older = render_reading(reading_facts(synthetic_study(), cross()))
    assert "an earlier protocol: it records no `data_seed`" in older
    assert "a question its last tokens before the answer); these cells do not record how many" in older


def test_each_task_objective_is_held_to_the_premise_of_trading_perplexity_for_accuracy():
    study = synthetic_study()
    bought = [
        {**c, "objective": "task_ce", "key": c["key"].replace("task_margin", "task_ce"),
         "metrics": metrics(c["metrics"]["wikitext2/perplexity"], 95)}
        for c in study["cells"]
        if c["objective"] == "task_margin"
    ]  # fmt: skip
    study["cells"] += bought
    text = render_reading(reading_facts(study))
    # M = 9: margin 70..76 against perplexity 80..86; task_ce 95 everywhere
    assert "task_margin on qa-b are 10.0 points less accurate" in text
    assert "task_margin did not buy accuracy here, **against the premise of task calibration**" in text
    assert "task_ce on qa-b (an extension: not in the paper) are 12.0 points more accurate" in text
    assert "task_ce bought accuracy with perplexity, the premise of task calibration." in text


def test_a_disagreement_on_the_papers_budget_is_stated_as_one():
    study = synthetic_study()
    for cell in study["cells"]:  # perplexity now falls as accuracy rises in every cell: ρ = +1 everywhere
        if cell["drop"] == 9 and cell["search"] in STUDY_SEARCHES and cell["objective"] == "perplexity":
            cell["metrics"] = metrics(10 * 2 ** (6 - STUDY_SEARCHES.index(cell["search"])), 80)
            cell["metrics"]["hellaswag/acc_norm"] = (80 + STUDY_SEARCHES.index(cell["search"])) / 100
    text = render_reading(reading_facts(study))
    assert (
        "perplexity: ρ positive in 1 of 1 cells, negative in 0; the paper: negative in 5 of 6: "
        "**a disagreement**" in text
    )


def test_write_reading_rerenders_the_report_around_it(tmp_path):
    import json

    from ground.core.errors import UserError
    from pruning.study.reading import write_reading

    study = synthetic_study()
    for row in study["cells"]:
        row.update(dense_loss=1.0, search_seconds=1.0, block_forwards=1, subset_evaluations=1)
        row.update(variant=None, checkpoint=None)
    (tmp_path / "study.json").write_text(json.dumps(study))
    reading = write_reading(tmp_path)
    assert (tmp_path / "reading.md").read_text() == reading
    readme = (tmp_path / "README.md").read_text()
    assert readme.startswith("# Depth-pruning study: synthetic\n\n## Reading\n") and reading.strip() in readme
    assert "## Headline" in readme and "Reading" in (tmp_path / "report.html").read_text()
    (tmp_path / "healed").mkdir()
    (tmp_path / "healed" / "study.json").write_text(json.dumps({**study, "healing": {}}))
    with pytest.raises(UserError, match="healing"):
        write_reading(tmp_path / "healed")
    assert not (tmp_path / "healed" / "reading.md").exists()


def test_with_each_seed_its_own_draw_the_reading_measures_how_far_the_draw_moves_the_mask():
    study = synthetic_study(data_seed=0)
    redrawn = []
    for first in study["cells"]:
        shifted = (
            [block + 1 for block in first["removed_blocks"]] if first["search"] != "streamline" else None
        )
        again = cell(
            first["objective"], first["data"], first["drop"], first["search"],
            shifted or first["removed_blocks"], 10, 80, seed=1, data_seed=1, draw=1,
        )  # fmt: skip
        redrawn.append(again)
    study["cells"] += redrawn
    study["summary"]["seeds"] = [0, 1]
    facts = reading_facts(study)
    rows = {row["drop"]: row for row in facts["seed_stability"]["across_draws"]}
    assert rows[9]["seven"] == pytest.approx(0.8) and rows[9]["seven_pairs"] == 14  # {0..8} vs {1..9}
    assert rows[12]["seven"] == pytest.approx(11 / 13) and rows[12]["baselines"] == 1.0
    text = render_reading(facts)
    assert "**The calibration draw (what the seeds vary).**" in text
    import json

    from benchmarks.study_reading import jsonable

    changed = json.loads(json.dumps(jsonable(facts)))["seed_stability"]["changed"]  # `study_reading --facts`
    assert changed and all(" | " in key for key in changed)  # tables keyed by (configuration, M, search)
    assert (
        "M = 9 (≈ the paper's 9): J across draws 0.800 for the seven (14 pairs) (across searches within a "
        "draw 1.000, across calibrations 0.000: the draw moves the mask more than the search, less than the "
        "calibration), 1.000 for the baselines" in text
    )


def test_the_papers_conclusion_on_accuracy_movement_is_judged_plainly(facts):
    like = facts["movement"]["like"]
    assert like["ratio"] == pytest.approx(10.0 / (56 / 21))
    assert like["ratio_seeds"] is None  # one seed: no range to give
    text = render_reading(facts)
    assert (
        "ratio 3.75; the paper: 2.06 and 1.85 points, ratio 1.11. **This does not support the paper's "
        "conclusion** that configuration and search move accuracy comparably" in text
    )


def test_a_ratio_with_nothing_to_compare_is_not_read_as_a_verdict():
    """A study (or a partial one) without two configurations on the paper's budgets has no §5.2 ratio."""
    from pruning.study.reading_compare import movement_verdict

    verdict = movement_verdict({"ratio": math.nan, "ratio_seeds": None, "seeds": []})
    assert verdict.startswith("Not determined") and "support" not in verdict
    assert "does not support" in movement_verdict({"ratio": 3.0, "ratio_seeds": None, "seeds": [0]})


def test_a_verdict_on_one_seed_says_one_seed_not_every_seed():
    """One calibration draw behind §5.2's verdict (the cross-controls ran seed 0 only) is no "every seed"."""
    from pruning.study.reading_compare import movement_verdict

    one = movement_verdict({"ratio": 3.0, "ratio_seeds": None, "seeds": [0]})
    assert "in its one seed (0) a change of configuration moves it 3.00×" in one and "every" not in one
    several = movement_verdict({"ratio": 3.0, "ratio_seeds": (2.5, 4.0), "seeds": [0, 1, 2]})
    assert "in every seed a change of configuration moves it 2.50×" in several


def test_task_ce_is_an_extension_kept_out_of_every_comparison_with_the_paper():
    study = synthetic_study()
    study["cells"] += [
        {**c, "objective": "task_ce", "key": c["key"].replace("task_margin", "task_ce"),
         "removed_blocks": list(range(5, 5 + c["drop"]))}
        for c in study["cells"]
        if c["objective"] == "task_margin"
    ]  # fmt: skip
    facts = reading_facts(study)
    at9 = facts["headline"]["by_drop"]["9"]
    assert (at9["across_calibrations"], at9["pairs"]) == (0.0, (42, 7))  # as without task_ce
    assert facts["headline"]["with_task_ce"][1] > 0  # task_ce's {5..13} overlaps perplexity's {0..8}
    assert facts["movement"]["like"]["pairs"] == (7, 42)
    assert facts["movement"]["with_task_ce"]["pairs"] == (21, 63)
    text = render_reading(facts)
    assert "With task_ce (an extension) as a third calibration" in text
    assert "task_ce (an extension: not in the paper): ρ positive" in text
    assert "| task_ce on qa-b (an extension: not in the paper) | M = 9 (≈ the paper's 9) |" in text


def test_accuracy_variance_is_shown_beside_its_binomial_floor():
    study = synthetic_study()
    study["summary"]["eval_limit"] = 40
    rows = {(r["configuration"], r["drop"]): r for r in reading_facts(study)["quality"]}
    assert rows["perplexity on text-a", 9]["acc_floor"] == pytest.approx(83 * 17 / 40)  # accuracies 80..86
    text = render_reading(reading_facts(study))
    assert "| binomial floor (points²) |" in text and "| 4.0 | 35.3 | 83.0 (86.0, 80.0) |" in text
    assert "the margin at M = 9: 4.0 points², 0.1× its binomial floor of 49.3" in text
    assert "no more than chance gives on this many items" in text


def test_the_accuracy_is_named_for_what_it_is_wherever_it_is_quoted():
    study = synthetic_study()
    study["summary"]["eval_limit"] = 40
    study["summary"]["calibrations"] = [
        {"objective": "perplexity", "data": "pydoc", "samples": 4, "seq_len": 32},
        {"objective": "task_margin", "data": "pydoc-cloze", "samples": 4, "seq_len": 128},
    ]
    study["accuracy_metrics"] = {"pydoc_cloze": "acc_norm"}
    for row in study["cells"]:
        row["metrics"]["pydoc_cloze/acc_norm"] = row["metrics"].pop("hellaswag/acc_norm")
    facts = reading_facts(study)
    assert facts["evaluation"]["short"] == "pydoc-cloze accuracy, 40 items"
    full = facts["evaluation"]["full"]
    assert full.startswith("pydoc-cloze accuracy, 40 items, in-domain for the perplexity objective (built fr")
    text = render_reading(facts)
    for heading in ("**Accuracy movement (§5.2), ", "**Perplexity rank vs accuracy rank (§5.3), "):
        assert heading + full in text
    assert f"Accuracy throughout: {full}." in text


def test_searches_converge_per_objective_beside_the_draws():
    rows = {r["configuration"]: r for r in reading_facts(synthetic_study())["objective_agreement"]}
    assert rows["perplexity on text-a"]["across_searches"] == 1.0  # every search removes {0..8} at M = 9
    assert (
        rows["perplexity on text-a"]["search_pairs"] == 21 and rows["perplexity on text-a"]["draw_pairs"] == 0
    )
    assert "**Do the searches converge under a fixed objective?**" in render_reading(
        reading_facts(synthetic_study())
    )


def test_an_independent_task_is_read_alone_beside_the_in_domain_one():
    """Issue 42: judged on pydoc-cloze (in-domain for perplexity) and GCIDE-define (no calibration's domain),
    the reading names both with their n and says per task what §5.2 and §5.3 find, so a result of the
    in-domain task alone cannot pass for the calibration's."""
    study = synthetic_study()
    study["summary"]["calibrations"] = [
        {"objective": "perplexity", "data": "pydoc", "samples": 4, "seq_len": 32},
        {"objective": "task_margin", "data": "pydoc-cloze", "samples": 4, "seq_len": 128},
    ]
    study["accuracy_metrics"] = {"pydoc_cloze": "acc_norm", "gcide_define": "acc"}
    study["dense"].update({"pydoc_cloze/n": 341, "gcide_define/n": 200})
    for row in study["cells"]:
        accuracy = row["metrics"].pop("hellaswag/acc_norm")
        row["metrics"]["pydoc_cloze/acc_norm"] = accuracy
        # out of domain, perplexity's masks rank the other way: a lower perplexity, a higher accuracy
        flipped = row["objective"] == "perplexity" and row["drop"] == 9
        row["metrics"]["gcide_define/acc"] = 1.66 - accuracy if flipped else accuracy
    facts = reading_facts(study)
    short = "mean accuracy over pydoc-cloze (341 items), gcide-define (200 items)"
    assert facts["evaluation"]["short"] == short
    assert "gcide-define out of domain for every calibration" in facts["evaluation"]["full"]
    assert facts["effective_items"] == pytest.approx(4 / (1 / 341 + 1 / 200))
    text = render_reading(facts)
    paragraph = next(p for p in text.split("\n\n") if p.startswith("**Each accuracy task alone"))
    cloze, define = paragraph.split("*gcide-define accuracy, 200 items")
    assert "*pydoc-cloze accuracy, 341 items, in-domain for the perplexity objective" in cloze
    agreement = "perplexity ρ positive in 0 of 1, negative in 1 (**an agreement** with the paper's negative"
    assert agreement in cloze
    assert "out of domain for every calibration" in define
    disagreement = "perplexity ρ positive in 1 of 1, negative in 0 (**a disagreement** with the paper's"
    assert disagreement in define
    assert "measured on 504 items (the mean over its tasks as one binomial)" in text  # 4 / (1/341 + 1/200)
    assert "task_margin ρ positive in 1 of 1" in define


def test_the_calibration_size_arm_says_whether_more_questions_rescue_a_task_objective():
    """Issue 42 item 2: the task objective calibrated on more questions, judged on the same yardstick, beside
    the study's own cells of the same seeds and perplexity calibration's; another yardstick is refused."""
    study = synthetic_study()
    arm = synthetic_study()
    for calibration in arm["summary"]["calibrations"]:  # as a study records them: per objective
        calibration["samples"] = 16
    arm["cells"] = [c for c in arm["cells"] if c["objective"] == "task_margin" and c["drop"] == 9]
    for position, row in enumerate(arm["cells"]):
        row["metrics"]["hellaswag/acc_norm"] = (85 + position) / 100  # above perplexity's 80..86
    text = render_reading(reading_facts(study, size=arm))
    paragraph = next(p for p in text.split("\n\n") if p.startswith("**Calibration size"))
    assert (
        "task_margin at M = 9 (≈ the paper's 9), 16 questions against 4: **rescued**: as accurate as "
        "perplexity calibration in its one seed (0)" in paragraph
    )
    table = text.split(paragraph)[1]
    assert "| task_margin | M = 9 (≈ the paper's 9) | 4 | 7 (0) |" in table
    assert "| task_margin | M = 9 (≈ the paper's 9) | 16 | 7 (0) |" in table and "| 83.0 |" in table
    for row in arm["cells"]:
        row["metrics"]["hellaswag/acc_norm"] = 0.75  # above the margin's own 73, below perplexity's 83
    text = render_reading(reading_facts(study, size=arm))
    assert "16 questions against 4: more accurate in its one seed (0), **not rescued**" in text
    arm["summary"]["eval_limit"] = 40
    text = render_reading(reading_facts(study, size=arm))
    assert "judged on another yardstick (its eval_limit differ from the study's): not compared" in text
