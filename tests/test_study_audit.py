"""Issue 55's audit of the reading on a synthetic study whose answers are known by hand: searches failing
their own objective named and left out of σ², §5.2's ratio with a bootstrap interval (per arm too), §5.3 on
the calibration objective's own value, and the variants that beat dense on their calibration loss."""

from __future__ import annotations

import math
import statistics

from pruning.study.reading import reading_facts, render_reading
from pruning.study.reading_audit import (
    MIN_DISTINCT_MASKS,
    calibration_spearman_facts,
    failing_searches,
    movement_interval,
)
from pruning.study.reading_basis import STUDY_SEARCHES, Cells

CONFIGURATIONS = (("perplexity", "text-a"), ("task_margin", "qa-b"))


def cell(objective, drop, search, seed, mask, loss, acc, dense_loss=1.0) -> dict:
    data = dict(CONFIGURATIONS)[objective]
    return {
        "key": f"{objective}|{data}|4|32|{seed}|documents|m{drop}|{search}|seed{seed}|single_block",
        "objective": objective, "data": data, "drop": drop, "search": search, "seed": seed,
        "prior": "single_block", "removed_blocks": sorted(mask), "calibration_loss": loss,
        "dense_loss": dense_loss, "subset_evaluations": 10 if search == "cbo" else 200,
        "metrics": {"wikitext2/perplexity": 10.0 + loss, "hellaswag/acc": acc / 100, "hellaswag/n": 100},
    }  # fmt: skip


def study(seeds=(0, 1)) -> dict:
    """30 blocks, M = 8 (the paper's 9), two seeds. Under perplexity search i scores loss 1 − i/10 and
    accuracy 60 + i, except cbo (i = 5), whose loss 9 is worse than one_shot's 1.0, at accuracy 20; under
    the margin every search finds accuracy 40 + i at loss −i (below dense's −0.5 for i ≥ 1)."""
    cells = []
    for seed in seeds:
        for i, search in enumerate(STUDY_SEARCHES):
            failing = search == "cbo"
            cells.append(
                cell("perplexity", 8, search, seed, range(i, i + 8), 9.0 if failing else 1 - i / 10,
                     20 if failing else 60 + i)
            )  # fmt: skip
            cells.append(cell("task_margin", 8, search, seed, range(i + 1, i + 9), -i, 40 + i, -0.5))
    return {
        "summary": {
            "model": "m",
            "model_name": "m",
            "num_blocks": 30,
            "drops": [8],
            "seeds": list(seeds),
            "objectives": ["perplexity", "task_margin"],
            "searches": list(STUDY_SEARCHES),
            "suites": ["offline"],
            "eval_limit": 100,
            "eval_seq_len": 128,
            "options": {"cbo": {"evaluations": "greedy"}},
            "calibrations": [
                {"objective": o, "data": d, "samples": 4, "seq_len": 32, "sampling": "documents"}
                for o, d in CONFIGURATIONS
            ],
        },  # fmt: skip
        "dense": {"wikitext2/perplexity": 9.0, "hellaswag/acc": 0.9, "hellaswag/n": 100},
        "average_perplexity_tasks": ["wikitext2"],
        "accuracy_metrics": {"hellaswag": "acc"},
        "cells": cells,
    }


def test_a_search_worse_than_one_shot_on_its_own_objective_fails_it():
    members = [c for c in study()["cells"] if c["objective"] == "perplexity" and c["seed"] == 0]
    assert failing_searches(members) == ["cbo"]
    margin = [c for c in study()["cells"] if c["objective"] == "task_margin" and c["seed"] == 0]
    assert failing_searches(margin) == []  # every loss at or below one_shot's 0


def test_variance_is_given_with_and_without_the_failing_searches_and_the_searches_named():
    facts = reading_facts(study())
    rows = {r["configuration"]: r for r in facts["audit"]["budgets"]["variance"]}
    perplexity = rows["perplexity on text-a"]
    assert perplexity["failing"] == {"cbo": 2}
    assert math.isclose(
        perplexity["variance_without_failing"], statistics.pvariance([60, 61, 62, 63, 64, 66])
    )
    assert perplexity["variance"] > 10 * perplexity["variance_without_failing"]
    margin = rows["task_margin on qa-b"]
    assert margin["variance"] == margin["variance_without_failing"]
    assert math.isclose(margin["variance"], 4.0)  # population variance of 40..46
    text = render_reading(facts)
    assert "without the searches failing their own objective (cbo in 2 of 2)" in text
    assert "cbo 10" in text and "greedy 200" in text
    assert "budgets set in subset evaluations: cbo at greedy" in text


def test_the_ratio_of_section_5_2_carries_a_reproducible_bootstrap_interval():
    cells = Cells(study())
    first = movement_interval(cells, paper_only=True)
    again = movement_interval(cells, paper_only=True)
    assert first == again and first["draws"] > 0
    low, high = first["ci95"]
    assert low <= first["ratio"] <= high
    # the point estimate is the ratio of the two means of accuracy_movement
    from pruning.study import statistics as study_stats

    accuracies = {
        (f"{c['objective']} on {c['data']}", c["search"], c["drop"], c["seed"]): cells.acc(c)
        for c in cells.main
    }
    movement = study_stats.accuracy_movement(accuracies)
    assert math.isclose(first["ratio"], movement.across_configurations_mean / movement.across_searches_mean)


def test_an_arm_gets_its_own_ratio_and_dense_beating_count():
    arm = study(seeds=(0,))
    arm["summary"]["calibrations"] = [
        {**c, "samples": 64, **({"margin_clip": 1.0} if c["objective"] == "task_margin" else {})}
        for c in arm["summary"]["calibrations"]
    ]
    text = render_reading(reading_facts(study(), arms=[arm]))
    assert "On the arm of 64 calibration questions (" in text and "task_margin clipped at ±1" in text
    # the margin's searches 1..6 score below dense's −0.5: six of seven per seed
    assert "task_margin on qa-b: 12 of 14" in text
    assert "task_margin on qa-b (64 questions): 6 of 7" in text


def test_section_5_3_correlates_the_calibration_loss_and_names_cells_with_too_few_masks():
    data = study()
    found = calibration_spearman_facts(Cells(data))
    margin = [r for r in found["cells"] if r["objective"] == "task_margin"]
    assert all(math.isclose(r["rho_loss"], 1.0) for r in margin)  # lowest loss, highest accuracy
    assert all(r["band_loss"][0] < 0 < r["band_loss"][1] for r in margin)
    for row in data["cells"]:
        if row["objective"] == "perplexity" and row["seed"] == 1:
            row["removed_blocks"] = [0, 1, 2, 3, 4, 5, 6, 7 + (row["search"] == "cbo")]
    found = calibration_spearman_facts(Cells(data))
    assert found["by_objective"]["perplexity"]["too_few_masks"] == 1
    assert MIN_DISTINCT_MASKS > 2
    text = render_reading(reading_facts(data))
    assert "perplexity on text-a M = 8 seed 1 (2 distinct masks)" in text


def test_an_arm_of_task_objectives_is_also_read_against_the_studys_perplexity_cells():
    """Issue 55 item 2: the paper's pair of objectives in the arm's regime, the arm's task_margin against the
    main study's perplexity cells of the same M, seeds and searches, with its bootstrap interval."""
    arm = study(seeds=(0,))
    arm["cells"] = [c for c in arm["cells"] if c["objective"] == "task_margin"]
    arm["summary"]["calibrations"] = [
        {**c, "samples": 64, "margin_clip": 1.0}
        for c in arm["summary"]["calibrations"]
        if c["objective"] != "perplexity"
    ]
    facts = reading_facts(study(), arms=[arm])
    paired = facts["audit"]["arms"][0]["movement_with_perplexity"]
    expected = movement_interval(Cells(study(seeds=(0,))), paper_only=True, drops=[8])
    assert (
        paired["ratio"] == expected["ratio"] and paired["ci95"] == expected["ci95"] and paired["seeds"] == [0]
    )
    assert "Its task_margin against the main study's perplexity cells" in render_reading(facts)
