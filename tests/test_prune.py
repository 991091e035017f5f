"""``depthprune prune``: input checks, the real-model path on a tiny model, sharing, resuming."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest

from depthprune.testing.cli import run_cli
from depthprune.testing.data import random_questions, random_texts, write_jsonl
from depthprune.testing.objectives import SyntheticObjective
from ground.core.errors import UserError
from pruning.calibration.config import CalibrationConfig
from pruning.pipeline.prune import (
    PruneConfig,
    parse_option_assignments,
    parse_searches,
    plan_prune,
    prune,
    run_searches,
)
from pruning.search import ALL_SEARCHES


@pytest.fixture(scope="module")
def files(tmp_path_factory, tiny_model_dirs):
    """A tiny 6-block llama plus hand-made text and question files in its vocabulary."""
    root = tmp_path_factory.mktemp("prune-data")
    rng = random.Random(0)
    text = write_jsonl(root / "text.jsonl", random_texts(rng, rows=6, words=60))
    rows = random_questions(rng, rows=6, choices=(2, 3), context_words=5, choice_words=2)
    questions = write_jsonl(root / "qa.jsonl", rows)
    return {"model": str(tiny_model_dirs("llama")), "text": f"text:{text}", "mc": f"mc:{questions}"}


def cli(*argv):
    """Run ``depthprune prune ...``; returns (exit code, stdout lines, stderr)."""
    code, out, err = run_cli("prune", *argv)
    return code, [line for line in out.splitlines() if line.strip()], err


def base_args(files, out, *extra):
    return [
        "--model",
        files["model"],
        "--objective",
        "perplexity",
        "--data",
        files["text"],
        "--samples",
        "4",
        "--seq-len",
        "32",
        "--out",
        str(out),
        *extra,
    ]


# ----------------------------------------------------------------------------------------- parsing


def test_parse_searches():
    assert parse_searches("greedy") == ("greedy",)
    assert parse_searches("beam, greedy,beam") == ("beam", "greedy")
    assert parse_searches("all") == ALL_SEARCHES and "exhaustive" not in parse_searches("all")
    assert parse_searches("all,exhaustive")[-1] == "exhaustive"
    with pytest.raises(UserError, match="unknown search 'sleb'"):
        parse_searches("greedy,sleb")
    with pytest.raises(UserError, match="no search"):
        parse_searches(" , ")


def test_parse_option_assignments():
    options = parse_option_assignments(
        ["width=3", "bayesian.trials=50", "bayesian.study_name=x"], ("beam", "bayesian", "greedy")
    )
    assert options == {"beam": {"width": 3}, "bayesian": {"trials": 50, "study_name": "x"}, "greedy": {}}
    # A bare key goes to every selected search that has it.
    assert parse_option_assignments(["prior=random"], ("one_shot", "genetic", "greedy"))["genetic"] == {
        "prior": "random"
    }
    cases = (("width", "KEY=VALUE"), ("beam.width=3", "not selected"), ("nothing=1", "no selected"))
    for bad, message in cases:
        with pytest.raises(UserError, match=message):
            parse_option_assignments([bad], ("greedy", "genetic"))


# ------------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--drop", "2", "--search", "sleb"], "unknown search 'sleb'"),
        (["--drop", "6", "--search", "greedy"], "cannot remove 6 of 6 blocks"),
        (["--drop", "0", "--search", "greedy"], "--drop must be a positive integer"),
        (["--drop", "2", "--search", "greedy", "--random-prior"], "--random-prior applies"),
        (["--drop", "2", "--search", "beam", "-o", "width=0"], "width must be a positive integer"),
        (["--drop", "2", "--search", "beam", "-o", "depth=2"], "no selected search has an option 'depth'"),
    ],
)
def test_bad_input_is_one_line_before_heavy_work(files, tmp_path, extra, message):
    code, out, err = cli(*base_args(files, tmp_path / "out", *extra))
    assert code == 2 and not out
    assert err.startswith("error: ") and message in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_bad_data_and_model_fail_early(files, tmp_path):
    code, _, err = cli(
        "--model",
        files["model"],
        "--objective",
        "task_margin",
        "--data",
        files["text"],
        "--drop",
        "2",
        "--out",
        str(tmp_path),
    )
    assert code == 2 and err.startswith("error: ")
    code, _, err = cli(
        "--model",
        str(tmp_path / "missing"),
        "--objective",
        "perplexity",
        "--data",
        files["text"],
        "--drop",
        "2",
        "--out",
        str(tmp_path),
    )
    assert code == 2 and "missing" in err


# --------------------------------------------------------------------------- shared evaluator logic


def test_run_searches_shares_the_prior_and_counts_per_search():
    objective = SyntheticObjective(num_blocks=10, interaction=1.0)
    runs = run_searches(
        objective, 3, ("one_shot", "genetic", "fast_block_select", "greedy"), options={}, progress=False
    )
    assert objective.prior_computations == 1
    assert [run.search for run in runs] == ["one_shot", "genetic", "fast_block_select", "greedy"]
    by_name = {run.search: run for run in runs}
    assert by_name["one_shot"].used_prior and by_name["one_shot"].subset_evaluations == 11
    assert not by_name["greedy"].used_prior and by_name["greedy"].subset_evaluations == 10 + 9 + 8
    assert all(run.block_forwards is None for run in runs)  # the synthetic objective has no stats


# --------------------------------------------------------------------------------- the real path


@pytest.mark.slow
def test_prune_all_on_a_tiny_model_writes_and_registers(files, tmp_path):
    from pruning.calibration.scoring.build import build_evaluator
    from pruning.model.checkpoint import PrunedCheckpoint
    from registry import open_registry

    out = tmp_path / "variants"
    args = base_args(
        files,
        out,
        "--drop",
        "2",
        "--search",
        "all,exhaustive",
        "-o",
        "bayesian.trials=12",
        "-o",
        "evolution.generations=4",
        "--seed",
        "3",
        "--json",
    )
    code, lines, err = cli(*args)
    assert code == 0, err
    reports = [json.loads(line) for line in lines]
    assert [report["search"] for report in reports] == [*ALL_SEARCHES, "exhaustive"]
    best = min(report["calibration_loss"] for report in reports)
    exhaustive = reports[-1]
    assert exhaustive["calibration_loss"] == pytest.approx(best)  # nothing beats the exact optimum
    assert exhaustive["subset_evaluations"] == 15  # C(6, 2)

    evaluator = build_evaluator(
        files["model"], CalibrationConfig("perplexity", files["text"], samples=4, seq_len=32), progress=False
    )
    registry = open_registry()
    for report in reports:
        assert set(report) >= {
            "id",
            "removed_blocks",
            "calibration_loss",
            "dense_loss",
            "search_seconds",
            "block_forwards",
            "subset_evaluations",
        }
        assert len(report["removed_blocks"]) == 2 and report["search_seconds"] >= 0
        expected = evaluator.score(frozenset(report["removed_blocks"]))
        assert report["calibration_loss"] == pytest.approx(expected)
        assert report["dense_loss"] == pytest.approx(evaluator.dense_loss())
        written = PrunedCheckpoint.read(report["checkpoint"])
        assert written.removed_blocks == report["removed_blocks"] and written.calibration["samples"] == 4
        variant = registry.resolve(report["id"])
        assert variant.search == report["search"] and variant.removed_blocks == report["removed_blocks"]
        assert variant.subset_evaluations == report["subset_evaluations"]
        assert variant.checkpoint_sha256 == written.weights_sha256
        # pruning.json carries the record that was registered.
        assert (written.variant.search, written.variant.search_options) == (variant.search, report["options"])
        assert written.variant.checkpoint_path == variant.checkpoint_path
        assert written.variant.subset_evaluations == variant.subset_evaluations
        # what ran the search, so seconds from several machines are never compared unknowingly
        assert variant.search_options["cost"]["device"].endswith(f"{os.cpu_count()} logical cores")
    cbo = next(report for report in reports if report["search"] == "cbo")
    assert cbo["options"]["exact"] is True

    # Re-running the same command re-scores nothing (memo + Optuna storage) and reuses the checkpoints.
    code, lines, err = cli(*args)
    assert code == 0, err
    again = [json.loads(line) for line in lines]
    for first, second in zip(reports, again):
        assert second["removed_blocks"] == first["removed_blocks"] and second["id"] == first["id"]
        assert second["checkpoint"] == first["checkpoint"]
        if first["search"] != "cbo":  # CBO's gradients are recomputed; scores never are
            assert second["block_forwards"] == 0, second["search"]


@pytest.mark.slow
def test_interrupted_run_saves_scores_and_resumes(files, tmp_path):
    calibration = CalibrationConfig("task_margin", files["mc"], samples=4, seq_len=32, seed=2)
    config = PruneConfig(
        model=files["model"],
        calibration=calibration,
        drop=3,
        searches=("greedy", "beam"),
        out=tmp_path,
        progress=False,
    )

    def interrupt(_outcome):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        prune(config, on_variant=interrupt)
    memo = json.loads(plan_prune(config).memo_path.read_text())
    assert len(memo["scores"]) == 1 + 6 + 5 + 4  # dense, greedy's three steps

    outcomes = prune(config)
    greedy, beam = outcomes
    assert greedy.block_forwards == 0  # every subset greedy needs came from the saved memo
    assert beam.calibration_loss <= greedy.calibration_loss


def test_a_checkpoint_copied_without_its_weights_is_written_again(files, tmp_path):
    """A variant directory holding its pruning.json but no weight files (copied from another machine without
    them) is not reused as it is: re-running the command writes the weights again, and says so."""
    from ground.core.checksums import WEIGHT_PATTERNS, weights_sha256
    from registry import open_registry

    args = base_args(files, tmp_path / "v", "--drop", "2", "--search", "one_shot", "--json")
    code, lines, err = cli(*args)
    assert code == 0, err
    checkpoint = json.loads(lines[-1])["checkpoint"]
    registered = open_registry().resolve(json.loads(lines[-1])["id"]).checkpoint_sha256
    for pattern in WEIGHT_PATTERNS:
        for weights in Path(checkpoint).glob(pattern):
            weights.unlink()
    code, lines, err = cli(*args)
    assert code == 0, err
    assert "no weights: writing them again" in err  # stderr: stdout stays JSON lines
    assert weights_sha256(checkpoint) == registered  # the same weights as before, loadable again


def test_several_searches_are_scored_on_validation_data_and_the_lowest_is_selected(files, tmp_path):
    """``--validation mc:PATH``: every line carries validation_loss and fit, exactly one is selected (the
    lowest), the quality record reaches the registry and pruning.json; an item longer than --seq-len is one
    line naming the length needed."""
    from pruning.model.checkpoint import PrunedCheckpoint
    from registry import open_registry

    rng = random.Random(5)
    held_out = write_jsonl(
        tmp_path / "held.jsonl",
        random_questions(rng, rows=5, choices=(2, 3), context_words=5, choice_words=3),
    )
    args = [
        "--model", files["model"], "--objective", "task_ce", "--data", files["mc"], "--samples", "4",
        "--seq-len", "64", "--out", str(tmp_path / "v"), "--drop", "2", "--json",
        "--search", "one_shot,block_influence", "--validation", f"mc:{held_out}",
    ]  # fmt: skip
    code, lines, err = cli(*args)
    assert code == 0, err
    reports = [json.loads(line) for line in lines]
    assert [report["search"] for report in reports] == ["one_shot", "block_influence"]
    losses = [report["validation_loss"] for report in reports]
    assert [report["selected"] for report in reports] == [loss == min(losses) for loss in losses]
    assert sum(report["selected"] for report in reports) == 1
    registry = open_registry()
    for report in reports:
        assert isinstance(report["fit"], bool) and report["quality"]["validation_data"] == f"mc:{held_out}"
        assert registry.resolve(report["id"]).fit == report["fit"]
        assert PrunedCheckpoint.read(report["checkpoint"]).variant.quality["fit"] == report["fit"]
    code, _, err = cli(*[arg if arg != "64" else "8" for arg in args])
    assert code != 0 and "needs" in err and "more than --seq-len 8" in err and "--truncate" in err
