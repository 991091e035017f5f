"""`depthprune demo`: its plans (real and demo model), a tiny end-to-end run, and its clean-up."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from depthprune.cli import demo as pipeline
from depthprune.cli.demo import DemoConfig, plan_demo
from depthprune.testing.servers import free_port, wait_until
from ground.core.errors import UserError
from ground.core.processes import stop_process_group
from pruning.search import SEARCHES


def processes_with_home(home: Path) -> list[int]:
    """Live processes started with DEPTHPRUNE_HOME=home: the demo's servers, engines and workers inherit it,
    and nothing of another test's (which may be starting engines in the other pytest worker) has it."""
    found = []
    for process in psutil.process_iter():
        try:
            if process.environ().get("DEPTHPRUNE_HOME") == str(home):
                found.append(process.pid)
        except psutil.Error:  # gone, a zombie, or another user's
            continue
    return found


@pytest.mark.slow
@pytest.mark.vllm
def test_demo_runs_end_to_end(tmp_path):
    env = {**os.environ, "DEPTHPRUNE_HOME": str(tmp_path / "home")}
    env.pop("DEPTHPRUNE_REGISTRY_URL", None)
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "depthprune",
            "demo",
            "--recipe",
            "tiny",
            "--quick",
            "--port",
            str(free_port()),
            "--json",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=1500,
    )
    assert completed.returncode == 0, completed.stderr[-5000:]
    rows = json.loads(completed.stdout.strip().splitlines()[-1])
    by_variant = {row["variant"]: row for row in rows}
    assert {"dense", "ppl-best", "ce-best"} <= set(by_variant)
    assert len(rows) == 6  # dense, its A/A control, (fast, thorough) x (perplexity, task_ce)
    for row in rows:
        if row["variant"] != "dense (A/A)":  # the A/A row is a measurement of dense, not a model of its own
            assert row["perplexity"] > 1 and 0 <= row["qa_accuracy"] <= 1
            assert set(row["quality"]) == {"demo_text", "demo_qa"}
    dense_text = by_variant["dense"]["quality"]["demo_text"]
    assert dense_text["perplexity"] == pytest.approx(by_variant["dense"]["perplexity"])
    assert dense_text["n"] > 0 and dense_text["perplexity_ci95"][0] <= dense_text["perplexity"]
    for alias in ("ppl-best", "ce-best"):  # retention paired against dense on the same windows and items
        for record in by_variant[alias]["quality"].values():
            low, high = record["retention_ci95"]
            assert low <= record["retention"] <= high and record["verdict"]
    for alias in ("ppl-best", "ce-best"):
        assert len(by_variant[alias]["removed_blocks"]) == 2  # 25% of the tiny model's 8 blocks
    row = by_variant["ppl-best"]
    assert row["output_throughput_ratio"] > 0 and row["ideal_speedup"] == pytest.approx(8 / 6)
    low, high = row["output_throughput_ratio_ci95"]  # two rounds give an interval
    assert low <= row["output_throughput_ratio"] <= high
    # ce-best keeps 6 of 8 identical blocks too: the same computation, load-tested once (ppl-best's)
    assert by_variant["ce-best"]["speed_of"] == "ppl-best"
    assert by_variant["ce-best"]["output_throughput_ratio"] is None
    assert "ce-best: not load-tested; its speed is ppl-best's by construction" in completed.stderr
    noise_floor = by_variant["dense (A/A)"]
    assert noise_floor["objective"] == "noise floor" and noise_floor["output_throughput_ratio_ci95"]
    assert (tmp_path / "home" / "demo" / "summary.json").is_file()
    assert "depthprune demo: every variant against dense" in completed.stderr
    assert "quality kept: % of dense" in completed.stderr
    assert re.search(r"^== \[\d+:\d\d\] load test", completed.stderr, re.M), "step headings show the minutes"
    # orphans of a killed group are reaped by init a moment after the kill
    left = tmp_path / "home"
    wait_until(lambda: processes_with_home(left) == [], 10, "no process of the demo's left behind")


def test_stop_process_group_kills_children_too():
    parent = subprocess.Popen(
        ["sh", "-c", "trap '' INT; sleep 300 & sleep 300 & wait"], start_new_session=True
    )
    time.sleep(0.5)
    stop_process_group(parent, signal.SIGINT, grace_s=1)
    assert parent.returncode is not None
    # Orphaned children are reaped by init a moment after the kill.
    wait_until(lambda: group_members(parent.pid) == [], 10, "the group's children gone")


def group_members(pgid: int) -> list[str]:
    """Live (not zombie) processes of a process group."""
    listing = subprocess.run(["ps", "-eo", "pgid=,stat="], capture_output=True, text=True).stdout
    return [
        line
        for line in listing.splitlines()
        if line.split()[0] == str(pgid) and not line.split()[1].startswith("Z")
    ]


def test_interrupt_stops_a_cooperative_group_gracefully():
    # The child sets Python's Ctrl-C handler: started from a background job it would inherit SIGINT ignored.
    sleeper = "import signal, time; signal.signal(signal.SIGINT, signal.default_int_handler); time.sleep(300)"
    parent = subprocess.Popen([sys.executable, "-c", sleeper], start_new_session=True)
    time.sleep(0.5)
    started = time.monotonic()
    stop_process_group(parent, signal.SIGINT, grace_s=30)
    assert parent.returncode == -signal.SIGINT or parent.returncode == 1
    assert time.monotonic() - started < 10


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"recipe": "huge"}, "unknown recipe"),
        ({"drop_fraction": 1.0}, "drop-fraction"),
        ({"samples": 0}, "--samples"),
        ({"port": 80}, "--port"),
        ({"eval_limit": 0}, "--eval-limit"),
        ({"searches": ("one_shot", "nonsense")}, "unknown search"),
        ({"model": "smollm2-135m", "recipe": "tiny"}, "--recipe"),
    ],
)
def test_bad_demo_settings(settings, message):
    with pytest.raises(UserError, match=message):
        DemoConfig(**settings)


class PlanPrinted(Exception):
    """Stops a demo run right after it printed its plan."""


def test_the_real_model_plan_is_what_the_demo_prints(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DEPTHPRUNE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("DEPTHPRUNE_REGISTRY_URL", raising=False)
    config = DemoConfig(out=tmp_path / "out")
    assert config.model == "smollm2-135m" and not config.quick
    plan = plan_demo(config, num_blocks=30)
    assert plan.drop == 8  # round(0.25 x 30): 27 % of SmolLM2-135M's 30 blocks
    assert plan.data == {"perplexity": "pydoc", "task_ce": "pydoc-phrase"}
    assert plan.searches == ("one_shot",)
    assert set(plan.searches) <= set(SEARCHES)
    sizes = plan.sizes
    assert (sizes.text_samples, sizes.choice_samples, sizes.seq_len, sizes.patch_windows) == (8, 24, 256, 64)
    assert (sizes.eval_seq_len, sizes.eval_limit) == (256, 24)
    assert (sizes.rounds, sizes.num_prompts, sizes.input_len, sizes.output_len) == (4, 16, 64, 64)
    # One block of the balanced order for 4 arms, a second only when the first did not decide.
    assert (sizes.max_rounds, sizes.load_budget_s, sizes.stop_rule) == (8, 150, "decision")
    precise = plan_demo(DemoConfig(out=tmp_path / "out", precise=True), num_blocks=30).sizes
    assert (precise.max_rounds, precise.load_budget_s, precise.stop_rule) == (36, 660, "precision")
    assert plan.suite == "offline" and plan.tasks == ("pydoc", "pydoc_cloze")
    assert plan.serve_args == ("--max-model-len", "512", "--vllm-arg=--enforce-eager")
    assert plan.ideal_speedup == pytest.approx(30 / 22)

    # The demo prints exactly this plan before pruning: stop it there, with the model step stubbed out.
    def stop(*args, **kwargs):
        raise PlanPrinted

    monkeypatch.setattr(pipeline, "prepare_model", lambda config: "/converted/smollm2-135m")
    monkeypatch.setattr(pipeline, "read_num_blocks", lambda model_dir: 30)
    monkeypatch.setattr(pipeline, "prune_variants", stop)
    with pytest.raises(PlanPrinted):
        pipeline.run_demo(config)
    printed = capsys.readouterr().err
    assert plan.describe() in printed
    for expected in (
        "smollm2-135m (30 blocks): remove M = 8 (27%; ideal speed-up N/(N-M) = 1.36x)",
        "perplexity  on pydoc: 8 windows x 256 tokens, batch 8",
        "task_ce     on pydoc-phrase: 24 items of at most 256 tokens, batch 8",
        "searches on each objective: one_shot",
        "offline suite (in-domain pydoc perplexity and pydoc-cloze accuracy, out-of-domain GCIDE perplexity "
        "and GCIDE-define accuracy; 256-token windows), at most 24 of each",
        "one vLLM engine each (--max-model-len 512 --vllm-arg=--enforce-eager)",
        "repair: ppl-best patched without training (heal --method patch: <= 64 windows x 256 tokens of "
        "pydoc), evaluated as the others, not served (its speed is its parent's); about ",
        "4-8 interleaved rounds (at most 150 s) x 16 requests x (64 prompt + 64 generated tokens) per model "
        "and an A/A control, all at once, until each variant's interval excludes 1 and the A/A one is within "
        "±5%",
    ):
        assert expected in printed


def test_the_demo_model_keeps_its_plan():
    config = DemoConfig(recipe="tiny", quick=True)
    assert config.model == "demo" and config.recipe == "tiny"
    plan = plan_demo(config, num_blocks=8)
    assert plan.drop == 2 and plan.searches == ("one_shot", "greedy")
    assert plan.data == {"perplexity": "demo:text", "task_ce": "demo:qa"}
    assert plan.calibration_data("task_ce", "/m") == "demo:qa@/m"
    assert (plan.sizes.text_samples, plan.sizes.seq_len, plan.sizes.eval_limit) == (8, 64, None)
    assert (plan.sizes.num_prompts, plan.sizes.output_len, plan.sizes.rounds, plan.sizes.max_rounds) == (
        8,
        16,
        2,
        2,
    )
    assert plan.suite == "demo" and plan.serve_args == ("--vllm-arg=--enforce-eager",) and not plan.repair
    assert "repair" not in plan.describe()
    full = plan_demo(DemoConfig(model="demo"), num_blocks=16)
    assert full.serve_args == ()  # the default recipe serves compiled engines
    assert full.drop == 4 and (full.sizes.text_samples, full.sizes.seq_len) == (32, 128)
    assert (full.sizes.num_prompts, full.sizes.output_len, full.sizes.rounds) == (48, 64, 2)


def test_overrides_replace_the_plan_sizes():
    config = DemoConfig(samples=5, seq_len=64, eval_limit=3, searches=("one_shot",), drop_fraction=0.1)
    plan = plan_demo(config, num_blocks=30)
    assert (plan.sizes.text_samples, plan.sizes.choice_samples, plan.sizes.seq_len) == (5, 5, 64)
    assert plan.sizes.eval_limit == 3 and plan.searches == ("one_shot",) and plan.drop == 3


def test_the_repair_step_patches_ppl_best_and_scores_the_child(demo_tiny_dir, tmp_path, capsys):
    """The real-model step (:mod:`depthprune.cli.demo_repair`), run here on the tiny model: the child of
    ``ppl-best`` registered with a validation loss, and its row right after its parent's."""
    from depthprune.cli import demo_repair
    from depthprune.cli.demo import DEMO_QUICK_SIZES, DemoPlan
    from pruning.calibration.config import CalibrationConfig
    from pruning.pipeline.prune import PruneConfig, prune
    from registry import open_registry

    model = str(demo_tiny_dir)
    data = f"demo:text@{model}"
    (outcome,) = prune(
        PruneConfig(
            model=model,
            calibration=CalibrationConfig("perplexity", data, samples=4, seq_len=32),
            drop=2,
            searches=("one_shot",),
            out=str(tmp_path / "variants"),
            progress=False,
        )
    )
    config = DemoConfig(recipe="tiny", quick=True, out=tmp_path / "out")
    plan = DemoPlan(model, 8, 2, {"perplexity": data}, ("one_shot",), DEMO_QUICK_SIZES, repair=True)
    with open_registry() as registry:
        registry.set_alias("ppl-best", outcome.name)
        base = registry.resolve(outcome.name).base_model
        repaired = demo_repair.repair_best(config, plan, registry, base, pipeline.say)
        child = registry.resolve(repaired.name)
    assert repaired.parent == outcome.name and child.parent == outcome.name
    assert child.removed_blocks == outcome.removed_blocks
    assert child.quality["validation_loss"] is not None and child.quality["parent_validation_loss"] == (
        outcome.validation_loss
    )
    assert "estimated" in capsys.readouterr().err
    rows = [{"name": "dense"}, {"name": outcome.name}, {"name": "other"}]
    row = demo_repair.repaired_row(repaired, child, {"perplexity": None, "qa_accuracy": None}, {})
    assert [item["name"] for item in demo_repair.with_repaired(rows, row)][2] == repaired.name
