"""Seeds of a study: each seed draws its own calibration samples unless ``--data-seed`` pins the draw,
and then a deterministic search runs once and its other seeds' cells copy that cell (issue 29, rule 1)."""

from __future__ import annotations

import json

import pytest

SEARCHES = ("one_shot", "block_influence", "genetic")
"""Two searches that ignore the seed and one that draws with it."""
QUICK_GENETIC = {"genetic": {"population": 4, "generations": 1}}


def tiny_study(model, out, **overrides):
    from pruning.study.plan import StudyConfig

    settings = dict(
        model=str(model),
        drops=(2,),
        objectives=("perplexity",),
        searches=SEARCHES,
        seeds=(0, 1),
        samples=5,  # a calibration no other test of the session's registry uses
        seq_len=32,
        options=QUICK_GENETIC,
        suites=("demo",),
        engine="torch",
        eval_seq_len=32,
        eval_limit=2,
        out=out / "report",
        checkpoints=out / "variants",
        progress=False,
    )
    return StudyConfig(**{**settings, **overrides})


def cells_of(report) -> dict[tuple[str, int], dict]:
    cells = json.loads((report / "study.json").read_text())["cells"]
    return {(cell["search"], cell["seed"]): cell for cell in cells}


@pytest.mark.slow
def test_each_seed_draws_its_own_calibration_samples(tiny_demo_like, tmp_path):
    from pruning.study.run import run_study

    cells = cells_of(run_study(tiny_study(tiny_demo_like, tmp_path)))
    assert {(search, seed): cell["data_seed"] for (search, seed), cell in cells.items()} == {
        (search, seed): seed for search in SEARCHES for seed in (0, 1)
    }
    assert all(cell["reused_from"] is None and cell["truncated_items"] == 0 for cell in cells.values())
    # another draw is another calibration: its own key, its own variant
    assert cells["one_shot", 0]["key"] != cells["one_shot", 1]["key"]
    assert cells["one_shot", 0]["variant"] != cells["one_shot", 1]["variant"]


@pytest.mark.slow
def test_a_pinned_draw_runs_a_deterministic_search_once(tiny_demo_like, tmp_path, capsys):
    from pruning.study.run import run_study

    # samples=6: a calibration of its own, so the other test's seed-0 cells are not found in the registry
    config = tiny_study(tiny_demo_like, tmp_path, data_seed=0, samples=6, progress=True)
    cells = cells_of(run_study(config))
    assert "6 cells, 0 already done, 4 to run, 2 reused from the first seed" in capsys.readouterr().out
    assert {cell["data_seed"] for cell in cells.values()} == {0}
    for search in ("one_shot", "block_influence"):
        copy, source = cells[search, 1], cells[search, 0]
        assert copy["reused_from"] == source["key"] and source["reused_from"] is None
        assert (copy["removed_blocks"], copy["variant"]) == (source["removed_blocks"], source["variant"])
        assert copy["metrics"] == source["metrics"] and copy["metrics"]
    assert cells["genetic", 0]["reused_from"] is None and cells["genetic", 1]["reused_from"] is None
    # a rerun finds every running cell and copies the reused ones again
    run_study(config)
    assert "6 cells, 4 already done, 0 to run, 2 reused" in capsys.readouterr().out


def test_a_random_prior_is_seeded_so_its_cells_are_never_reused(tiny_demo_like, tmp_path):
    from pruning.study.plan import plan_study

    plan = plan_study(
        tiny_study(tiny_demo_like, tmp_path, data_seed=3, seeds=(2, 0, 1), random_prior_control=True)
    )
    reused = {(c.search, c.seed, c.prior): c.reused_from for c in plan.cells if c.reused_from}
    assert {key[:2] for key in reused} == {
        (s, seed) for s in ("one_shot", "block_influence") for seed in (0, 1)
    }
    assert all(prior == "single_block" for _, _, prior in reused)
    assert all(source.split("|")[-2] == "seed2" for source in reused.values())  # the first seed listed
    assert {c.data_seed for c in plan.cells} == {3}


def test_data_seed_must_be_a_non_negative_integer(tiny_demo_like, tmp_path):
    from ground.core.errors import UserError

    with pytest.raises(UserError, match="--data-seed needs a non-negative integer"):
        tiny_study(tiny_demo_like, tmp_path, data_seed=-1)


def test_truncated_items_is_read_from_the_calibration_record():
    from types import SimpleNamespace

    from pruning.study.cells import truncated_items

    assert truncated_items(SimpleNamespace(calibration={"objective": "perplexity"})) == 0
    assert truncated_items(SimpleNamespace(calibration={"truncated_items": 3})) == 3
    assert truncated_items(SimpleNamespace(calibration=None)) == 0


@pytest.mark.slow
def test_a_pruned_cell_keeps_the_count_its_calibration_recorded(tiny_demo_like, tmp_path):
    """A cell pruned by this run reports the ``truncated_items`` that its variant's calibration record holds
    (the prune outcome's, not a count of 0 for want of one)."""
    from pruning.study.run import run_study
    from registry import open_registry

    config = tiny_study(
        tiny_demo_like,
        tmp_path,
        objectives=("task_margin",),
        searches=("one_shot", "block_influence"),
        seeds=(0,),
        truncate=True,
        choice_seq_len=4,  # shorter than every question of the tiny data: each one is cut
    )
    cells = cells_of(run_study(config))
    registry = open_registry()
    assert len(cells) == 2
    for cell in cells.values():
        recorded = registry.resolve(cell["variant"]).calibration["truncated_items"]
        assert cell["truncated_items"] == recorded > 0


def test_questions_get_their_own_length_cap(tiny_demo_like, tmp_path):
    from pruning.study.plan import plan_study

    plan = plan_study(
        tiny_study(tiny_demo_like, tmp_path, objectives=("perplexity", "task_margin"), choice_seq_len=64)
    )
    lengths = {(c.calibration.objective, c.calibration.seq_len) for c in plan.cells}
    assert lengths == {("perplexity", 32), ("task_margin", 64)}
