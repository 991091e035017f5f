"""benchmarks.bench_repair's tables: each child labelled by its parent and method, its heal seconds, and the
gap it recovered, re-rendered from a run's files without running anything."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.bench_repair import TASKS, rendered


def model(label: str, baseline: bool, perplexity: float, **paired) -> dict:
    pydoc = {"perplexity": perplexity, "perplexity_ci95": [perplexity - 1, perplexity + 1], **paired}
    return {"label": label, "baseline": baseline, "tasks": {"pydoc": pydoc}}


def test_a_run_is_rendered_again_from_its_files(tmp_path):
    child = "smollm2-135m-perplexity-one-shot-m8-75e923-patch-baceef"
    (tmp_path / "eval.json").write_text(
        json.dumps(
            [
                model("dense", True, 11.19),
                model("ppl-best", False, 40.39, retention=27.7, retention_ci95=[26.2, 28.9]),
                model(child, False, 21.6, gap_recovered=0.488, gap_recovered_ci95=[0.471, 0.505]),
            ]
        )
    )
    heals = [{"parent": "ppl-best", "method": "patch", "name": child, "seconds": 316.4}]
    (tmp_path / "heals.json").write_text(json.dumps(heals))
    lines = rendered(tmp_path)
    assert "| dense | 11.19 [10.19, 12.19] | – | – | – | – |" in lines
    assert "| ppl-best | 40.39 [39.39, 41.39]; 27.7 [26.2, 28.9] % | – | – | – | – |" in lines
    assert any(line.startswith("| ppl-best + patch | 21.60 [20.60, 22.60]") and line.endswith("| 316 |")
               for line in lines)  # fmt: skip
    assert "| ppl-best + patch | 0.488 [0.471, 0.505] | – |" in lines


def test_each_child_is_compared_with_its_parent_on_the_same_items(tmp_path):
    """Issue 55 item 6: a child's paired difference from its parent per task (the ratio for perplexity, the
    accuracy difference with McNemar's p), and 'no measurable change' where the interval holds it."""
    child = "ce-best-distill"
    dense = model("dense", True, 11.19)
    parent = model("ce-best", False, 90.3)
    repaired = model(child, False, 40.2)
    repaired["tasks"]["pydoc"]["against_parent"] = {
        "perplexity_ratio": 0.445, "perplexity_ratio_ci95": [0.43, 0.46], "verdict": "better",
    }  # fmt: skip
    repaired["tasks"]["gcide_define"] = {
        "accuracy": 0.598,
        "against_parent": {
            "accuracy_delta": -0.05, "accuracy_delta_ci95": [-0.102, 0.004], "mcnemar_p": 0.07,
            "verdict": "no measurable change",
        },
    }  # fmt: skip
    (tmp_path / "eval.json").write_text(json.dumps([dense, parent, repaired]))
    heals = [{"parent": "ce-best", "method": "distill", "name": child, "seconds": 167.0}]
    (tmp_path / "heals.json").write_text(json.dumps(heals))
    lines = rendered(tmp_path)
    assert "| child against its parent | pydoc ppl | GCIDE ppl | pydoc-cloze | GCIDE-define |" in lines
    assert (
        "| ce-best + distill | ×0.445 [0.430, 0.460] | – | – | -0.050 [-0.102, +0.004], p 0.07 "
        "(no measurable change) |" in lines
    )


def test_eval_pairs_each_result_of_a_child_with_its_parent():
    from pruning.evaluation.item_scores import accuracy_statistics
    from pruning.evaluation.paired import AGAINST_PARENT, add_gap_recovered
    from pruning.evaluation.suites import EvalResult

    keys = [f"item {index}" for index in range(40)]

    def accuracy(correct):
        return EvalResult("offline", "gcide_define", "acc", sum(correct) / len(correct),
                          {"statistics": accuracy_statistics(keys, correct)})  # fmt: skip

    parent = [accuracy([1] * 30 + [0] * 10)]
    child = [accuracy([1] * 20 + [0] * 20)]  # lost 10 items, gained none
    add_gap_recovered([accuracy([1] * 40)], parent, child)
    paired = child[0].settings["statistics"][AGAINST_PARENT]
    assert paired["accuracy_delta"] == -0.25 and paired["items_lost"] == 10 and paired["items_gained"] == 0
    assert paired["mcnemar_p"] < 0.01 and paired["verdict"] == "worse" and paired["baseline"] == "parent"


def test_a_killed_run_resumes_after_its_last_heal(tmp_path, monkeypatch):
    """A heal recorded in heals.json is kept with its seconds, not run again (it would find its child in the
    registry and time nothing); the heals after it run, and eval pairs every child with its parent."""
    import benchmarks.bench_repair as bench

    kept = {"parent": "ppl-best", "method": "patch", "name": "ppl-best-patched", "seconds": 316.4}
    (tmp_path / "heals.json").write_text(json.dumps([kept]))
    commands = []

    def fake_run(command, log):
        commands.append(command[3:])
        if command[3] == "heal":
            return {"name": f"{command[4]}-{command[6]}"}, 12.0
        return [model("dense", True, 11.19)], 5.0

    monkeypatch.setattr(bench, "run_json", fake_run)
    bench.main(["--out", str(tmp_path), "--parents", "ppl-best", "--methods", "patch,lora"])
    assert [command[:4] for command in commands] == [
        ["heal", "ppl-best", "--method", "lora"],
        ["eval", "dense", "ppl-best", "ppl-best-patched"],
    ]
    assert commands[1][:5] == ["eval", "dense", "ppl-best", "ppl-best-patched", "ppl-best-lora"]
    heals = json.loads((tmp_path / "heals.json").read_text())
    assert heals == [kept, {"parent": "ppl-best", "method": "lora", "name": "ppl-best-lora", "seconds": 12.0}]


RECORD = Path(__file__).resolve().parent.parent / "docs" / "repair-smollm2-135m"


def test_the_committed_repair_comparison_pairs_every_child_with_its_parent_and_dense():
    """Issue 55 item 6's acceptance, from the committed JSON alone: every child has, on every task, its
    retention against dense and its paired difference from its parent, each with a 95 % interval."""
    models = {entry["label"]: entry for entry in json.loads((RECORD / "eval.json").read_text())}
    heals = json.loads((RECORD / "heals.json").read_text())
    methods = {heal["method"] for heal in heals}
    assert len(heals) == 8 and methods == {"patch", "lora", "distill", "last-blocks"}
    for heal in heals:
        tasks = models[heal["name"]]["tasks"]
        for task, _ in TASKS:
            record = tasks[task]
            low, high = record["retention_ci95"]
            assert low <= record["retention"] <= high
            paired = record["against_parent"]
            key = "perplexity_ratio" if "perplexity_ratio" in paired else "accuracy_delta"
            low, high = paired[f"{key}_ci95"]
            assert low <= paired[key] <= high and paired["verdict"]


def test_the_repair_tables_in_benchmarks_md_are_rendered_from_the_committed_json():
    """docs/benchmarks.md quotes the committed run's tables as `bench_repair --render` prints them."""
    document = (RECORD.parent / "benchmarks.md").read_text()
    tables = "\n".join(rendered(RECORD)).split("\n\n")
    assert len(tables) == 3 and all(table in document for table in tables)
