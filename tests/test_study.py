"""The study's statistics on hand-computed cases, and a tiny end-to-end study."""

from __future__ import annotations

import math

import pytest

from pruning.study.statistics import (
    full_overlap,
    headline_comparison,
    inter_method_variance,
    jaccard,
    pairwise_jaccard,
    perplexity_accuracy_spearman,
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


# ------------------------------------------------------------------------------ a tiny end-to-end study


@pytest.fixture(scope="module")
def tiny_demo_like(tmp_path_factory, tiny_model_dirs):
    """A tiny llama with hand-made demo-style data: text and questions, calibration and test splits."""
    import random

    from depthprune.testing.data import demo_like_model, random_questions, random_texts

    rng = random.Random(1)
    data = {}
    for split in ("calibration", "test"):
        data[f"text_{split}"] = random_texts(rng, rows=12, words=40)
        data[f"qa_{split}"] = random_questions(rng, rows=10, choices=3, context_words=5, labels="cycle")
    return demo_like_model(tiny_model_dirs("llama"), tmp_path_factory.mktemp("study-model") / "model", data)


@pytest.mark.slow
def test_tiny_study_end_to_end_and_resume(tiny_demo_like, tmp_path, capsys):
    import json

    from pruning.study.grid import StudyConfig, run_study
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
    for cell in cells:
        assert len(cell["removed_blocks"]) == 2
        assert set(cell["metrics"]) == {"demo_text/perplexity", "demo_qa/acc", "demo_qa/acc_norm"}
        recorded = {f"{e.task}/{e.metric}": e.value for e in registry.evaluations(cell["variant"])}
        assert recorded == pytest.approx(cell["metrics"])
    assert set(study["dense"]) == {"demo_text/perplexity", "demo_qa/acc", "demo_qa/acc_norm"}
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


def test_study_config_rejects_bad_grids(tiny_demo_like, tmp_path):
    from depthprune.errors import UserError
    from pruning.study.grid import StudyConfig, plan_study

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
    from depthprune.errors import UserError
    from pruning.search import STUDY_SEARCHES
    from pruning.study.grid import STUDY_BASELINES, study_searches

    assert study_searches("study") == STUDY_SEARCHES and len(STUDY_SEARCHES) == 7
    assert study_searches("all") == STUDY_SEARCHES + ("block_influence", "lorp", "streamline")
    assert STUDY_BASELINES == ("block_influence", "lorp", "streamline")
    assert study_searches("greedy, study,evolution")[:2] == ("greedy", "one_shot")
    assert study_searches("study,evolution")[-1] == "evolution"
    with pytest.raises(UserError, match="unknown search 'magic'"):
        study_searches("study,magic")
    with pytest.raises(UserError, match="no search given"):
        study_searches(" , ")
