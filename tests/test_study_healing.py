"""``study --heal``: every distinct mask healed once, evaluated, and compared before vs after in the report.

.venv/bin/python -m pytest tests/test_study_healing.py -q
"""

from __future__ import annotations

import json

import pytest

from ground.core.errors import UserError
from pruning.study.plan import HealOption, StudyConfig, parse_heal_option
from pruning.study.run import run_study
from pruning.study.statistics import inter_method_variance
from registry import open_registry

DEMO_METRICS = {"demo_text/perplexity", "demo_qa/acc", "demo_qa/acc_norm"}


def _config(model, tmp_path, **overrides) -> StudyConfig:
    fields = dict(
        model=str(model),
        drops=(2,),
        searches=("one_shot", "greedy"),
        samples=4,
        seq_len=32,
        engine="torch",
        eval_seq_len=32,
        out=tmp_path / "report",
        checkpoints=tmp_path / "variants",
        registry_url=f"sqlite:///{tmp_path / 'registry.db'}",
        heal="lora:2",
    )
    return StudyConfig(**{**fields, **overrides})


def _mean_acc_points(metrics: dict) -> float:
    return 100.0 * metrics["demo_qa/acc_norm"]  # the demo's reported metric


@pytest.mark.slow
def test_study_heals_each_distinct_mask_once_and_reports_before_vs_after(tiny_demo_like, tmp_path, capsys):
    config = _config(tiny_demo_like, tmp_path)
    report = run_study(config)
    first_output = capsys.readouterr().out
    study = json.loads((report / "study.json").read_text())
    cells, healing = study["cells"], study["healing"]
    masks = {tuple(cell["removed_blocks"]) for cell in cells}
    with open_registry(config.registry_url) as registry:
        variants = registry.list_variants()
        healed = [variant for variant in variants if variant.parent is not None]
        assert len(healed) == len(masks)  # one per distinct removal set, not one per cell
        assert first_output.count("study: healing") == len(masks)
        for variant in healed:
            parent = registry.resolve(variant.parent)
            assert parent.parent is None and parent.removed_blocks == variant.removed_blocks
            assert (variant.healing["method"], variant.healing["steps"]) == ("lora", 2)
            assert variant.healing["data"].startswith("demo:text@")  # the study's text calibration data
            assert variant.healing["train_split"] == "calibration" and variant.healing["eval_split"] == "test"
            recorded = {f"{e.task}/{e.metric}" for e in registry.evaluations(variant)}
            assert recorded == DEMO_METRICS
        healed_names = {variant.name for variant in healed}
    assert (healing["method"], healing["steps"]) == ("lora", 2)
    for cell in cells:
        entry = healing["variants"][cell["key"]]
        assert entry["name"] in healed_names and entry["removed_blocks"] == cell["removed_blocks"]
        assert {key for key in entry["metrics"] if not key.endswith(("_ci95", "/n"))} == DEMO_METRICS

    # the spread and the calibration effect, recomputed from the cells
    by_objective: dict[str, list[tuple[float, float]]] = {}
    for cell in cells:
        after = healing["variants"][cell["key"]]["metrics"]
        by_objective.setdefault(cell["objective"], []).append(
            (_mean_acc_points(cell["metrics"]), _mean_acc_points(after))
        )
    spread = healing["spread"]["study"]
    for side, index in (("acc_before", 0), ("acc_after", 1)):
        expected = sum(
            inter_method_variance([pair[index] for pair in pairs]) for pairs in by_objective.values()
        )
        assert spread[side] == pytest.approx(expected / len(by_objective))
    after = {
        (cell["objective"], cell["search"]): healing["variants"][cell["key"]]["metrics"] for cell in cells
    }
    calibration_changes = [
        abs(_mean_acc_points(after["perplexity", search]) - _mean_acc_points(after["task_margin", search]))
        for search in ("one_shot", "greedy")
    ]
    moved = healing["movement"]["mean_acc_after"]["study"]["2"]
    assert moved["across_configurations_mean"] == pytest.approx(sum(calibration_changes) / 2)

    markdown = (report / "README.md").read_text()
    for title in (
        "Healing: does the search, or the calibration, still matter?",
        "Healing (lora, 2 steps): each search before vs after",
        "Healing: inter-search spread σ² before vs after",
        "Healing: calibration effect vs search effect before vs after",
    ):
        assert f"## {title}" in markdown
    assert markdown.index("## Healing") < markdown.index("## Figures")
    assert "After healing, the" in markdown or "cannot be compared" in markdown

    # a re-run finds every healed variant and its evaluations in the registry
    run_study(config)
    output = capsys.readouterr().out
    assert "study: healing" not in output and "evaluating" not in output
    with open_registry(config.registry_url) as registry:
        assert len(registry.list_variants()) == len(variants)


def test_heal_option_and_bad_input(tiny_demo_like, tmp_path):
    assert parse_heal_option("lora:200") == HealOption("lora", 200)
    assert parse_heal_option("distill:5") == HealOption("distill", 5)
    for text, message in (
        ("lora", "METHOD:STEPS"),
        ("sft:10", "METHOD:STEPS"),
        ("lora:0", "positive integer"),
        ("lora:-3", "positive integer"),
        ("distill:x", "positive integer"),
    ):
        with pytest.raises(UserError, match=message):
            _config(tiny_demo_like, tmp_path, heal=text)
    with pytest.raises(UserError, match="--heal-data needs --heal"):
        _config(tiny_demo_like, tmp_path, heal=None, heal_data="pydoc")
    with pytest.raises(UserError, match="multiple-choice"):
        _config(tiny_demo_like, tmp_path, heal_data="pydoc-cloze")
    with pytest.raises(UserError, match="--worker"):
        _config(tiny_demo_like, tmp_path, worker=True)


def test_cli_heal_option_is_checked_before_anything_runs(tiny_demo_like, tmp_path, run_cli):
    code, _, err = run_cli(
        "study", "--model", str(tiny_demo_like), "--drop", "2", "--searches", "one_shot,greedy",
        "--heal", "lora:0", "--out", str(tmp_path / "report"),
    )  # fmt: skip
    assert code == 2 and err.startswith("error: --heal 'lora:0': STEPS must be a positive integer")
    assert not (tmp_path / "report").exists()
