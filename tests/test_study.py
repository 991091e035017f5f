"""The study's statistics on hand-computed cases, and a tiny end-to-end study."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from pruning.study.statistics import (
    accuracy_movement,
    full_overlap,
    headline_comparison,
    inter_method_variance,
    jaccard,
    pairwise_jaccard,
    perplexity_accuracy_spearman,
    pooled_pairwise_jaccard,
    rank,
)


def test_jaccard_hand_computed():
    assert jaccard({1, 2, 3}, {2, 3, 4}) == pytest.approx(2 / 4)
    assert jaccard([0, 1], [2, 3]) == 0.0
    assert jaccard((5, 6), (6, 5)) == 1.0
    assert jaccard([], []) == 1.0


def test_pairwise_jaccard_mean_and_range():
    # pairs: {1,2}-{1,3}: 1/3; {1,2}-{1,2}: 1; {1,3}-{1,2}: 1/3
    summary = pairwise_jaccard([{1, 2}, {1, 3}, {1, 2}])
    assert summary.pairs == 3
    assert summary.mean == pytest.approx((1 / 3 + 1 + 1 / 3) / 3)
    assert summary.minimum == pytest.approx(1 / 3)
    assert summary.maximum == 1.0
    assert math.isnan(pairwise_jaccard([{1}]).mean)


def test_full_overlap():
    # ∩ = {2}, ∪ = {1, 2, 3, 4}
    assert full_overlap([{1, 2}, {2, 3}, {2, 4}]) == pytest.approx(1 / 4)
    assert full_overlap([{7, 8}, {8, 7}]) == 1.0
    assert full_overlap([{1}, {2}]) == 0.0


def test_inter_method_variance_is_population_variance():
    # mean 4, squared deviations 4, 0, 4 -> 8 / 3
    assert inter_method_variance([2.0, 4.0, 6.0]) == pytest.approx(8 / 3)
    assert inter_method_variance([3.0]) == 0.0
    assert inter_method_variance([1.0, float("nan"), 3.0]) == pytest.approx(1.0)


def test_rank_ties_and_direction():
    assert rank([10.0, 5.0, 5.0]) == [3.0, 1.5, 1.5]
    assert rank([0.1, 0.9, 0.5], descending=True) == [3.0, 1.0, 2.0]


def test_spearman_between_perplexity_rank_and_accuracy_rank():
    # perplexity orders the variants exactly as accuracy does -> +1
    assert perplexity_accuracy_spearman([10, 20, 30, 40], [0.8, 0.7, 0.6, 0.5]) == pytest.approx(1.0)
    # exactly reversed -> -1
    assert perplexity_accuracy_spearman([10, 20, 30, 40], [0.5, 0.6, 0.7, 0.8]) == pytest.approx(-1.0)
    # ranks (1,2,3,4) vs (2,1,4,3): d² = 1+1+1+1 = 4; ρ = 1 - 6·4/(4·15) = 0.6
    assert perplexity_accuracy_spearman([10, 20, 30, 40], [0.7, 0.8, 0.5, 0.6]) == pytest.approx(0.6)
    assert math.isnan(perplexity_accuracy_spearman([1, 2], [0.5, 0.6]))
    assert math.isnan(perplexity_accuracy_spearman([1, 2, 3], [0.5, 0.5, 0.5]))


def test_headline_comparison_separates_objectives_from_searches():
    masks = {
        ("perplexity", "greedy", 2): {0, 1},
        ("perplexity", "beam", 2): {0, 1},
        ("task_margin", "greedy", 2): {4, 5},
        ("task_margin", "beam", 2): {4, 6},
        # another budget: never compared with the masks above
        ("perplexity", "greedy", 3): {4, 5, 6},
    }
    headline = headline_comparison(masks)
    # same objective, different search: ppl 1.0, margin 1/3
    assert headline.search_pairs == 2
    assert headline.across_searches_same_objective == pytest.approx((1 + 1 / 3) / 2)
    # same search, different objective: greedy 0, beam 0
    assert headline.objective_pairs == 2
    assert headline.across_objectives_same_search == 0.0
    assert headline.calibration_matters_more is True


def test_pooled_pairwise_jaccard_pairs_only_within_a_cell():
    # cell 1: {1,2}-{1,3}: 1/3; cell 2: {4}-{4}: 1, {4}-{5}: 0, {4}-{5}: 0; never across cells
    pooled = pooled_pairwise_jaccard([[{1, 2}, {1, 3}], [{4}, {4}, {5}]])
    assert pooled.pairs == 4
    assert pooled.mean == pytest.approx((1 / 3 + 1 + 0 + 0) / 4)
    assert (pooled.minimum, pooled.maximum) == (0.0, 1.0)
    assert math.isnan(pooled_pairwise_jaccard([[{1}]]).mean)


def test_accuracy_movement_configuration_vs_search():
    accuracies = {
        ("ppl", "greedy", 2): 50.0,
        ("ppl", "beam", 2): 54.0,
        ("margin", "greedy", 2): 57.0,
        ("margin", "beam", 2): 56.0,
        ("margin", "beam", 3): 10.0,  # another budget: never paired with the above
        ("ppl", "bo", 2): float("nan"),  # not evaluated: left out
    }
    moved = accuracy_movement(accuracies)
    # configuration changes: greedy |50-57| = 7, beam |54-56| = 2
    assert moved.configuration_pairs == 2
    assert moved.across_configurations_mean == pytest.approx(4.5) and moved.across_configurations_max == 7
    # search changes: ppl |50-54| = 4, margin |57-56| = 1
    assert moved.search_pairs == 2
    assert moved.across_searches_mean == pytest.approx(2.5) and moved.across_searches_max == 4


# ------------------------------------------------------------------------------ the report's tables by hand

NUM_BLOCKS = 6
# objective -> search -> (mask, (wikitext2, c4, lambada) ppl, hellaswag (acc, acc_norm), winogrande acc, loss)
HAND_CELLS = {
    "perplexity": {
        "one_shot": ({1, 2}, (10, 20, 30), (0.40, 0.50), 0.60, 1.0),
        "greedy": ({1, 3}, (12, 18, 24), (0.45, 0.52), 0.62, 2.0),
        "beam": ({1, 3}, (11, 30, 40), (0.41, 0.46), 0.58, 3.0),
        "lorp": ({4, 5}, (15, 25, 35), (0.40, 0.44), 0.56, 4.0),
    },
    "task_margin": {
        "one_shot": ({2, 3}, (14, 22, 36), (0.50, 0.54), 0.64, -1.0),
        "greedy": ({2, 3}, (13, 21, 29), (0.50, 0.56), 0.60, -2.0),
        "beam": ({2, 4}, (16, 26, 33), (0.45, 0.50), 0.60, -3.0),
        "lorp": ({4, 5}, (20, 30, 40), (0.35, 0.40), 0.50, -4.0),
    },
}


def hand_metrics(ppl, hellaswag, winogrande) -> dict:
    metrics = {f"{task}/perplexity": float(value) for task, value in zip(("wikitext2", "c4", "lambada"), ppl)}
    metrics.update({"hellaswag/acc": hellaswag[0], "hellaswag/acc_norm": hellaswag[1]})
    metrics["winogrande/acc"] = winogrande
    return metrics


@pytest.fixture
def hand_report():
    from pruning.study.cells import CellResult
    from pruning.study.tables import build_sections

    cells = [
        CellResult(
            key=f"{objective}|{search}",
            objective=objective,
            data=f"{objective}-data",
            drop=2,
            search=search,
            seed=0,
            prior="single_block",
            removed_blocks=sorted(mask),
            calibration_loss=loss,
            dense_loss=0.0,
            search_seconds=1.0,
            block_forwards=10,
            subset_evaluations=5,
            variant=None,
            checkpoint=None,
            metrics=hand_metrics(ppl, hellaswag, winogrande),
        )  # fmt: skip
        for objective, searches in HAND_CELLS.items()
        for search, (mask, ppl, hellaswag, winogrande, loss) in searches.items()
    ]
    summary = {
        "model": "/models/tiny-llama", "num_blocks": NUM_BLOCKS, "drops": [2], "seeds": [0],
        "searches": ["one_shot", "greedy", "beam", "lorp"], "calibrations": [], "suites": ["all"],
        "engine": "torch", "eval_seq_len": 64, "eval_limit": None,
    }  # fmt: skip
    dense = hand_metrics((8, 12, 10), (0.45, 0.60), 0.70)
    sections, numbers = build_sections(summary, cells, dense)
    return {section.title: section for section in sections}, numbers


def row_of(section, *first):
    (row,) = [row for row in section.rows if row[: len(first)] == list(first)]
    return row


def test_perplexity_table_has_the_avg_column(hand_report):
    sections, numbers = hand_report
    table = sections["Perplexity"]
    assert table.header[-4:] == ["wikitext2 ppl", "c4 ppl", "lambada ppl", "Avg ppl (wikitext2, c4, lambada)"]
    # (12 + 18 + 24) / 3 = 18
    assert row_of(table, "perplexity", "2", "greedy") == [
        "perplexity", "2", "greedy", "□■□■□□", "12.00", "18.00", "24.00", "18.00"
    ]  # fmt: skip
    assert row_of(table, "dense")[-1] == "10.00"
    assert numbers["average_perplexity_tasks"] == ["wikitext2", "c4", "lambada"]


def test_accuracy_table_uses_each_tasks_metric_in_points(hand_report):
    sections, numbers = hand_report
    table = sections["Zero-shot accuracy, M = 2"]
    assert table.header == [
        "calibration", "search", "hellaswag acc_norm (%)", "winogrande acc (%)", "mean acc_norm/acc (%)"
    ]  # fmt: skip
    # hellaswag acc_norm 0.52 (not acc 0.45), winogrande acc 0.62: mean (52 + 62) / 2 = 57
    assert row_of(table, "perplexity", "greedy") == ["perplexity", "greedy", "52.00", "62.00", "57.00"]
    assert row_of(table, "dense") == ["dense", "–", "60.00", "70.00", "65.00"]
    assert numbers["accuracy_metrics"] == {"hellaswag": "acc_norm", "winogrande": "acc"}


def test_variance_in_points_squared_and_both_search_groups(hand_report):
    sections, numbers = hand_report
    table = sections["Inter-method variance σ²"]
    assert table.header[5] == "σ² mean acc_norm/acc (points²)"
    # study group, perplexity: Avg ppl 20, 18, 27 -> σ² 134/9; mean acc 55, 57, 52 -> σ² 38/9 points²;
    # loss 1, 2, 3 -> 2/3
    assert row_of(table, "study (3)", "perplexity") == [
        "study (3)", "perplexity", "2", "3", f"{134 / 9:.4f}", f"{38 / 9:.4f}", f"{2 / 3:.6f}"
    ]  # fmt: skip
    assert row_of(table, "all (4)", "perplexity")[3] == "4"
    assert numbers["search_groups"] == {
        "study": ["one_shot", "greedy", "beam"], "all": ["one_shot", "greedy", "beam", "lorp"]
    }  # fmt: skip


def test_spearman_ranks_by_avg_perplexity(hand_report):
    sections, _ = hand_report
    table = sections["Spearman ρ between perplexity rank and accuracy rank"]
    # Avg ppl 20, 18, 27 ranks (2, 1, 3) = accuracy 55, 57, 52 ranks (2, 1, 3): ρ = 1.
    # WikiText-2 alone (10, 12, 11) would give ranks (1, 3, 2) and ρ = -0.5.
    assert row_of(table, "study (3)", "perplexity") == ["study (3)", "perplexity", "2", "3", "1.000"]
    assert perplexity_accuracy_spearman([10, 12, 11], [55, 57, 52]) == pytest.approx(-0.5)


def test_accuracy_movement_and_pooled_jaccard_rows(hand_report):
    sections, numbers = hand_report
    movement = sections["Accuracy movement: configuration change vs search change (§5.2)"]
    # configuration changes (same search): |55-59|, |57-58|, |52-55| = 4, 1, 3 -> mean 8/3, max 4
    # search changes (same configuration): 2, 3, 5 and 1, 4, 3 -> mean 3, max 5
    assert row_of(movement, "tiny-llama", "2", "study (3)") == [
        "tiny-llama", "2", "study (3)", "2.67 (4.00)", "3", "3.00 (5.00)", "6"
    ]  # fmt: skip
    assert numbers["accuracy_movement"]["study"]["2"]["across_searches_max"] == pytest.approx(5.0)
    pooled = sections["Mask agreement aggregated over cells"]
    # pairs: 1/3, 1/3, 1 (perplexity) and 1, 1/3, 1/3 (margin): mean 5/9; full overlaps 1/3 and 1/3
    assert row_of(pooled, "tiny-llama", "study (3)", "2") == [
        "tiny-llama", "study (3)", "2", "2", "6", "0.556", "[0.333, 1.000]", "0.333"
    ]  # fmt: skip


# ------------------------------------------------------------------------------ a tiny end-to-end study


@pytest.mark.slow
def test_tiny_study_end_to_end_and_resume(tiny_demo_like, tmp_path, capsys, monkeypatch):
    import json

    from pruning.study.plan import StudyConfig
    from pruning.study.run import run_study
    from registry import open_registry

    config = StudyConfig(
        model=str(tiny_demo_like),
        drops=(2,),
        searches=("one_shot", "greedy"),
        samples=4,
        seq_len=32,
        engine="torch",
        eval_seq_len=32,
        out=tmp_path / "report",
        checkpoints=tmp_path / "variants",
        progress=False,
    )
    import pruning.evaluation.suites as suites

    evaluated = []
    evaluate_with_engine = suites.evaluate_with_engine

    def counting(engine, *args, **kwargs):
        evaluated.append(engine.mask)  # judged from the dense weights, mask by mask
        return evaluate_with_engine(engine, *args, **kwargs)

    monkeypatch.setattr(suites, "evaluate_with_engine", counting)
    report = run_study(config)
    for name in (
        "README.md",
        "report.html",
        "study.json",
        "cells.json",
        "figures/heatmap_m2.png",
        "figures/tradeoff.png",
        "figures/rank_correlation.png",
    ):
        assert (report / name).is_file(), name
    study = json.loads((report / "study.json").read_text())
    cells = study["cells"]
    assert {(c["objective"], c["search"]) for c in cells} == {
        (o, s) for o in ("perplexity", "task_margin") for s in ("one_shot", "greedy")
    }
    registry = open_registry()
    primary = {"demo_text/perplexity", "demo_qa/acc", "demo_qa/acc_norm"}
    for cell in cells:
        assert len(cell["removed_blocks"]) == 2
        # each number with its n and 95 % interval
        assert set(cell["metrics"]) == primary | {f"{key}_ci95" for key in primary} | {
            "demo_text/n",
            "demo_qa/n",
        }
        low, high = cell["metrics"]["demo_qa/acc_ci95"]
        assert low <= cell["metrics"]["demo_qa/acc"] <= high and cell["metrics"]["demo_qa/n"] == 10
        recorded = {f"{e.task}/{e.metric}": e.value for e in registry.evaluations(cell["variant"])}
        assert recorded == pytest.approx({key: cell["metrics"][key] for key in primary})
    # the dense model and each distinct mask once: a mask found twice is evaluated once
    distinct_masks = {tuple(cell["removed_blocks"]) for cell in cells}
    assert sorted(evaluated) == sorted([(), *distinct_masks])
    assert len(distinct_masks) < len({cell["variant"] for cell in cells})
    assert primary <= set(study["dense"])
    headline = study["headline"]["2"]
    assert headline["search_pairs"] == 2 and headline["objective_pairs"] == 2
    markdown = (report / "README.md").read_text()
    for title in (
        "Perplexity",
        "Zero-shot accuracy",
        "Search cost vs accuracy",
        "Mask agreement",
        "Inter-method variance",
        "Spearman",
        "Headline",
    ):
        assert title in markdown

    # resumable: a second run finds every cell and every evaluation and recomputes nothing
    before = (report / "cells.json").read_text()
    config.progress = True
    capsys.readouterr()
    run_study(config)
    output = capsys.readouterr().out
    assert "4 already done, 0 to run" in output
    assert "evaluating" not in output
    assert json.loads((report / "cells.json").read_text())["cells"] == json.loads(before)["cells"]

    # a fresh report directory rebuilds the grid from the registry alone
    config.out = tmp_path / "report-again"
    capsys.readouterr()
    run_study(config)
    assert "4 already done, 0 to run" in capsys.readouterr().out

    # a cell whose checkpoint lost its weights (copied without them) is not found: it runs again, and its
    # checkpoint can be loaded afterwards
    from ground.core.checksums import has_weight_files

    lost = registry.resolve(cells[0]["variant"]).checkpoint_path
    for weights in Path(lost).glob("*.safetensors"):
        weights.unlink()
    config.out = tmp_path / "report-third"
    capsys.readouterr()
    run_study(config)
    assert "3 already done, 1 to run" in capsys.readouterr().out
    assert has_weight_files(lost)


def test_a_clipped_margin_and_a_matched_budget_reach_the_cells(tiny_demo_like, tmp_path):
    """Issue 55: ``--margin-clip`` clips task_margin's calibrations only and names them in the key;
    ``-o cbo.evaluations=greedy`` gives CBO greedy's count at each cell's M."""
    from pruning.study.plan import StudyConfig, cell_options, plan_study

    plan = plan_study(
        StudyConfig(
            model=str(tiny_demo_like),
            drops=(2,),
            objectives=("task_margin", "task_ce"),
            searches=("greedy", "cbo"),
            margin_clip=1.0,
            options={"cbo": {"evaluations": "greedy"}},
            out=tmp_path,
        )
    )
    margin = [c for c in plan.cells if c.calibration.objective == "task_margin"]
    other = [c for c in plan.cells if c.calibration.objective == "task_ce"]
    assert margin and all(c.calibration.margin_clip == 1.0 and "task_margin@clip1|" in c.key for c in margin)
    assert other and all(c.calibration.margin_clip is None and "@clip" not in c.key for c in other)
    cbo = next(c for c in plan.cells if c.search == "cbo")
    assert cell_options(plan.config, plan.num_blocks, cbo) == {"keep": 2 * plan.num_blocks - 1}


def test_study_config_rejects_bad_grids(tiny_demo_like, tmp_path):
    from ground.core.errors import UserError
    from pruning.study.plan import StudyConfig, plan_study

    with pytest.raises(UserError, match="at least two"):
        StudyConfig(model=str(tiny_demo_like), drops=(2,), searches=("greedy",))
    with pytest.raises(UserError, match="unknown search"):
        StudyConfig(model=str(tiny_demo_like), drops=(2,), searches=("greedy", "magic"))
    with pytest.raises(UserError, match="unknown --sampling 'windows'"):
        StudyConfig(model=str(tiny_demo_like), drops=(2,), searches=("greedy", "beam"), sampling="windows")
    with pytest.raises(UserError, match="cannot remove 6 of 6"):
        plan_study(
            StudyConfig(model=str(tiny_demo_like), drops=(6,), searches=("greedy", "beam"), out=tmp_path)
        )
    with pytest.raises(UserError, match="needs multiple-choice data"):
        plan_study(
            StudyConfig(
                model=str(tiny_demo_like),
                drops=(2,),
                searches=("greedy", "beam"),
                data=(f"demo:text@{tiny_demo_like}",),
                out=tmp_path,
            )
        )


def test_study_searches_groups():
    from ground.core.errors import UserError
    from pruning.search import STUDY_SEARCHES
    from pruning.study.plan import STUDY_BASELINES, study_searches

    assert study_searches("study") == STUDY_SEARCHES and len(STUDY_SEARCHES) == 7
    assert study_searches("all") == STUDY_SEARCHES + ("block_influence", "lorp", "streamline")
    assert STUDY_BASELINES == ("block_influence", "lorp", "streamline")
    assert study_searches("greedy, study,evolution")[:2] == ("greedy", "one_shot")
    assert study_searches("study,evolution")[-1] == "evolution"
    with pytest.raises(UserError, match="unknown search 'magic'"):
        study_searches("study,magic")
    with pytest.raises(UserError, match="no search given"):
        study_searches(" , ")


def test_report_names_the_model_as_the_user_did(tiny_demo_like):
    from pruning.study.plan import StudyConfig, plan_study, plan_summary
    from pruning.study.tables import model_name

    summary = plan_summary(plan_study(StudyConfig(model=str(tiny_demo_like), drops=(2,), progress=False)))
    assert summary["model_name"] == tiny_demo_like.name
    # a converted GGUF's directory is a hash: the name the user gave wins over it
    assert (
        model_name({"model": "/home/models/gguf-b179c9523d0e", "model_name": "smollm2-135m"})
        == "smollm2-135m"
    )
    assert model_name({"model": "/home/models/demo-dac43d3e160a"}) == "demo-dac43d3e160a"  # older reports


def tiny_study(model, tmp_path, samples: int, **extra):
    """A study of the tiny model under perplexity alone, one_shot and greedy at M = 2; ``samples`` keeps its
    calibration apart from the other tests' in the session's registry."""
    from pruning.study.plan import StudyConfig

    settings = dict(
        model=str(model), drops=(2,), objectives=("perplexity",), searches=("one_shot", "greedy"),
        samples=samples, seq_len=32, engine="torch", eval_seq_len=32, out=tmp_path / "report",
        checkpoints=tmp_path / "variants", progress=False,
    )  # fmt: skip
    return StudyConfig(**{**settings, **extra})


def test_a_fresh_report_finds_every_seed_of_a_deterministic_search_in_the_registry(
    tiny_demo_like, tmp_path, capsys
):
    """Each seed of a deterministic search is its own calibration draw, so its own registry row, found again
    by a report in a new directory (a report recomputed seed 0 once, when one row served both seeds)."""
    from pruning.study.run import run_study
    from registry import open_registry

    config = tiny_study(tiny_demo_like, tmp_path, samples=3, seeds=(0, 1))
    run_study(config)
    variants = [v for v in open_registry().list_variants() if v.calibration["samples"] == 3]
    assert {(v.search, v.calibration["seed"]): v.search_options["seeds"] for v in variants} == {
        (search, seed): [seed] for search in ("one_shot", "greedy") for seed in (0, 1)
    }
    manifest = json.loads((tmp_path / "report" / "cells.json").read_text())["cells"]
    assert {cell["search_device"] for cell in manifest} == {variants[0].search_options["cost"]["device"]}
    # each cell names its draw's documents: one record per seed, the searches of a seed sharing it
    items = {(cell["search"], cell["seed"]): cell["calibration_items"] for cell in manifest}
    assert {record["unit"] for record in items.values()} == {"document"}
    assert all(len(record["sha256_16"]) == 3 for record in items.values())
    assert items["one_shot", 0] == items["greedy", 0] != items["greedy", 1] == items["one_shot", 1]
    config.out, config.progress = tmp_path / "report-again", True
    capsys.readouterr()
    run_study(config)
    assert "4 cells, 4 already done, 0 to run" in capsys.readouterr().out
    again = json.loads((config.out / "study.json").read_text())["cells"]
    assert {(cell["search"], cell["seed"]): cell["calibration_items"] for cell in again} == items
    # the committed records' backfill draws the same items from the manifest alone
    from benchmarks.study_calibration_items import fill

    found, differing = fill(tmp_path / "report")
    assert differing == [] and {cell["key"]: found[cell["key"]] for cell in manifest} == {
        cell["key"]: cell["calibration_items"] for cell in manifest
    }


def test_a_study_evaluates_the_offline_suite(tiny_demo_like, tmp_path):
    """`--suite offline` (what a real model has without the hub) evaluated nothing: its metrics were not
    counted, so every variant looked evaluated already."""
    from pruning.study.run import run_study

    config = tiny_study(tiny_demo_like, tmp_path, samples=2, suites=("offline",), eval_limit=2)
    report = run_study(config)
    study = json.loads((report / "study.json").read_text())
    expected = {
        "pydoc/perplexity",
        "pydoc_cloze/acc",
        "pydoc_cloze/acc_norm",
        "gcide/perplexity",
        "gcide_define/acc",
    }
    assert {key for key in study["dense"] if not key.endswith(("_ci95", "/n"))} == expected
    for cell in study["cells"]:
        assert {key for key in cell["metrics"] if not key.endswith(("_ci95", "/n"))} == expected
        assert cell["metrics"]["gcide_define/n"] == 2 and len(cell["metrics"]["gcide/perplexity_ci95"]) == 2


def test_keep_weights_none_releases_evaluated_weights_and_a_rerun_finds_every_cell(
    tiny_demo_like, tmp_path, capsys
):
    """A grid whose checkpoints would not fit on disk keeps each variant's numbers and the way back to its
    weights, not the weights: a rerun reuses every cell, serving says how to write the weights again, and
    that command writes the registered weights."""
    from depthprune.testing.cli import run_cli
    from ground.core.checksums import WEIGHTS_RELEASED, has_weight_files
    from ground.core.errors import UserError
    from pruning.study.run import run_study
    from registry import open_registry

    config = tiny_study(tiny_demo_like, tmp_path, samples=5, keep_weights="none")
    report = run_study(config)
    cells = json.loads((report / "study.json").read_text())["cells"]
    assert all(cell["metrics"] for cell in cells)
    registry = open_registry()
    variants = [registry.resolve(cell["variant"]) for cell in cells]
    for variant in variants:
        assert not has_weight_files(variant.checkpoint_path)
        assert (Path(variant.checkpoint_path) / WEIGHTS_RELEASED).is_file()
        assert (Path(variant.checkpoint_path) / "pruning.json").is_file()

    config.out, config.progress = tmp_path / "report-again", True
    capsys.readouterr()
    run_study(config)
    assert "2 cells, 2 already done, 0 to run" in capsys.readouterr().out

    with pytest.raises(
        UserError, match=r"were not kept \(study --keep-weights none: evaluated\); write them"
    ):
        registry.verify_checkpoint(variants[0])
    rebuild = json.loads((Path(variants[0].checkpoint_path) / WEIGHTS_RELEASED).read_text())["rebuild"]
    code, _, err = run_cli(*rebuild.replace("--dtype float32", "--dtype bfloat16").split()[1:])
    assert code == 2 and "not the released" in err and "nothing was changed" in err
    assert not has_weight_files(variants[0].checkpoint_path)
    code, _, err = run_cli(*rebuild.split()[1:])
    assert code == 0, err
    registry.verify_checkpoint(variants[0])  # the same weights, byte for byte


def test_a_manifest_from_another_machine_is_judged_again_from_its_masks(tiny_demo_like, tmp_path, capsys):
    """Issue 42: a finished study re-judged on a new yardstick where neither its checkpoints nor its registry
    exist: no cell is pruned again, each distinct mask is evaluated from the dense weights."""
    import shutil

    from pruning.study.run import run_study

    config = tiny_study(tiny_demo_like, tmp_path, samples=7, eval_limit=4)
    report = run_study(config)
    first = json.loads((report / "study.json").read_text())["cells"]
    assert all(cell["metrics"]["demo_qa/n"] == 4 for cell in first)
    shutil.rmtree(tmp_path / "variants")
    config.registry_url = f"sqlite:///{tmp_path / 'elsewhere.db'}"
    config.eval_limit, config.progress = 6, True
    capsys.readouterr()
    run_study(config)
    output = capsys.readouterr().out
    assert "2 already done, 0 to run" in output and "pruning" not in output
    assert "from the dense weights" in output
    again = json.loads((report / "study.json").read_text())["cells"]
    assert [cell["removed_blocks"] for cell in again] == [cell["removed_blocks"] for cell in first]
    for cell in again:
        assert cell["metrics"]["demo_qa/n"] == 6 and cell["evaluation"]["limit"] == 6
    capsys.readouterr()
    run_study(config)  # the cells' own records say they are judged under these settings
    assert "evaluating" not in capsys.readouterr().out
