"""``depthprune variants ...`` end to end through the real console entry point, on a SQLite registry.

.venv/bin/python -m pytest tests/test_registry_cli.py -q
"""

from __future__ import annotations

import csv
import io
import json

import pytest

from depthprune.testing.cli import run_cli
from depthprune.testing.variants import fake_checkpoint, register_example_base, register_example_variant
from registry import open_registry

BASE = "org/Tiny-Llama"
SUBCOMMANDS = ("list", "show", "compare", "alias", "export", "rm")


@pytest.fixture
def populated(tmp_path):
    """A registry with one base model, two variants, evaluations, a benchmark and an alias."""
    url = f"sqlite:///{tmp_path / 'registry.db'}"
    checkpoint = fake_checkpoint(tmp_path / "ckpt")
    with open_registry(url) as registry:
        register_example_base(registry, BASE, num_blocks=8)
        names = []
        for objective, removed, search in (("ppl", [1, 3], "greedy"), ("task_margin", [2, 5], "beam")):
            variant = register_example_variant(
                registry,
                removed,
                base_model=BASE,
                calibration={"objective": objective, "data": "c4", "samples": 8, "seq_len": 128, "seed": 0},
                search=search,
                checkpoint=checkpoint if search == "greedy" else None,
            )
            registry.add_evaluation(
                variant,
                suite="ppl",
                task="wikitext2",
                metric="perplexity",
                value=20.0 + len(names),
                settings={},
            )
            names.append(variant.name)
        registry.add_evaluation(
            "dense", suite="ppl", task="wikitext2", metric="perplexity", value=15.0, settings={}
        )
        registry.add_serving_benchmark(
            names[0],
            settings={"request_rate": 4},
            metrics={"median_ttft_ms": 12.5, "output_throughput": 900.0},
            hardware="cpu",
        )
        registry.add_serving_benchmark(
            "dense",
            settings={"request_rate": 4},
            metrics={"median_ttft_ms": 15.0, "output_throughput": 600.0},
            hardware="cpu",
        )
        registry.set_alias("ppl-best", names[0])
    return {"url": url, "names": names, "checkpoint": checkpoint}


@pytest.mark.parametrize("subcommand", SUBCOMMANDS)
def test_every_subcommand_has_help(subcommand):
    code, out, _ = run_cli("variants", subcommand, "--help")
    assert code == 0 and "--registry" in out and "--json" in out


def test_list_prints_a_table_and_json(populated):
    code, out, _ = run_cli("variants", "list", "--registry", populated["url"])
    assert code == 0
    assert all(name in out for name in populated["names"]) and "dense" in out and "■□■□■■■■" in out
    code, out, _ = run_cli("variants", "list", "--registry", populated["url"], "--json", "--no-dense")
    listed = json.loads(out)
    assert [entry["name"] for entry in listed] == populated["names"]
    assert listed[0]["aliases"] == ["ppl-best"] and listed[0]["objective"] == "ppl"


def test_show_gives_the_variant_with_its_evaluations_and_benchmarks(populated):
    code, out, _ = run_cli("variants", "show", "ppl-best", "--registry", populated["url"])
    assert code == 0 and populated["names"][0] in out and "Evaluations" in out and "Serving benchmarks" in out
    code, out, _ = run_cli("variants", "show", "ppl-best", "--registry", populated["url"], "--json")
    shown = json.loads(out)
    assert shown["variant"]["removed_blocks"] == [1, 3]
    assert [item["value"] for item in shown["evaluations"]] == [20.0]
    assert shown["serving_benchmarks"][0]["metrics"]["median_ttft_ms"] == 12.5


def test_compare_puts_variants_side_by_side(populated):
    first, second = populated["names"]
    code, out, _ = run_cli("variants", "compare", "dense", first, second, "--registry", populated["url"])
    assert code == 0
    assert "■■■■■■■■" in out and "■□■□■■■■" in out and "■■□■■□■■" in out
    assert "ppl/wikitext2/perplexity" in out and "TTFT p50 (ms)" in out and "1.5×" in out
    code, out, _ = run_cli("variants", "compare", "--registry", populated["url"], "--json")
    entries = json.loads(out)
    assert [entry["variant"]["name"] for entry in entries] == ["dense", first, second]
    assert [entry["evaluations"]["ppl/wikitext2/perplexity"] for entry in entries] == [15.0, 20.0, 21.0]
    assert entries[1]["latency"]["median_ttft_ms"] == 12.5 and entries[2]["latency"] == {}
    assert entries[1]["ideal_speedup"] == pytest.approx(8 / 6)
    assert [entry["measured_speedup"] for entry in entries] == [None, 1.5, None]


def test_compare_shows_the_interleaved_speedup_with_its_interval():
    from registry.compare import speedup_cell

    def cell(speedup, ci95=None, verdict=None):
        return speedup_cell(
            {"measured_speedup": speedup, "measured_speedup_ci95": ci95, "speedup_verdict": verdict}
        )

    assert cell(1.27, [1.21, 1.33]) == "1.27× [1.21, 1.33]"
    assert cell(1.02, [0.97, 1.07], "no measurable change") == "no measurable change (1.02× [0.97, 1.07])"
    assert (
        cell(1.6, [1.5, 1.7], "measurement problem: 1.20 [1.12, 1.28] of the ideal") == "measurement problem"
    )
    assert cell(1.5) == "1.5× (separate runs, no interval)" and cell(None) == "—"


def test_alias_sets_shows_lists_and_deletes(populated):
    url, second = populated["url"], populated["names"][1]
    code, out, _ = run_cli("variants", "alias", "margin-best", second, "--registry", url)
    assert code == 0 and f"margin-best -> {second}" in out
    code, out, _ = run_cli("variants", "alias", "margin-best", "--registry", url, "--json")
    assert json.loads(out)["variant"]["name"] == second
    code, out, _ = run_cli("variants", "alias", "--registry", url, "--json")
    assert json.loads(out) == {f"margin-best@{BASE}": second, f"ppl-best@{BASE}": populated["names"][0]}
    code, out, _ = run_cli("variants", "alias", "margin-best", "--delete", "--registry", url)
    assert code == 0
    code, _, err = run_cli("variants", "alias", "margin-best", "--registry", url)
    assert code == 2 and err.startswith("error: no variant or alias named 'margin-best'")


def test_export_writes_json_and_csv(populated, tmp_path):
    url = populated["url"]
    code, out, _ = run_cli("variants", "export", "--registry", url)
    document = json.loads(out)
    assert [variant["name"] for variant in document["variants"]] == ["dense", *populated["names"]]
    assert document["variants"][1]["serving_benchmarks"][0]["metrics"]["output_throughput"] == 900.0
    target = tmp_path / "out" / "registry.csv"
    code, out, _ = run_cli(
        "variants", "export", "--format", "csv", "--out", str(target), "--registry", url, "--json"
    )
    assert code == 0 and json.loads(out)["variants"] == 3
    rows = list(csv.DictReader(io.StringIO(target.read_text())))
    assert [row["name"] for row in rows] == ["dense", *populated["names"]]
    assert rows[1]["removed_blocks"] == "1 3" and rows[1]["ppl/wikitext2/perplexity"] == "20.0"
    assert rows[1]["serve:median_ttft_ms"] == "12.5" and rows[0]["ppl/wikitext2/perplexity"] == "15.0"
    assert sorted(path.name for path in target.parent.iterdir()) == ["registry.csv"]  # no temporary left


def test_csv_export_has_the_lineage_and_healing_columns(populated, tmp_path):
    url, first = populated["url"], populated["names"][0]
    healing = {
        "method": "lora", "data": "pydoc", "train_split": "heal", "steps": 200, "seed": 0,
        "hyperparameters": {"lr": 1e-4, "lora_rank": 8}, "train_loss": 2.5, "heldout_loss": 2.75,
        "parent_heldout_loss": 3.25, "wall_seconds": 61.5,
    }  # fmt: skip
    with open_registry(url) as registry:
        parent = registry.resolve(first)
        child = register_example_variant(
            registry,
            parent.removed_blocks,
            base_model=BASE,
            calibration=parent.calibration,
            parent=first,
            healing=healing,
        )
    target = tmp_path / "registry.csv"
    code, _, _ = run_cli("variants", "export", "--format", "csv", "--out", str(target), "--registry", url)
    assert code == 0
    rows = {row["name"]: row for row in csv.DictReader(io.StringIO(target.read_text()))}
    healed = rows[child.name]
    assert (healed["parent"], healed["parent_id"]) == (first, str(parent.id))
    assert [healed[f"healing:{key}"] for key in ("method", "data", "steps")] == ["lora", "pydoc", "200"]
    assert (healed["healing:heldout_loss"], healed["healing:parent_heldout_loss"]) == ("2.75", "3.25")
    assert healed["healing:wall_seconds"] == "61.5" and json.loads(healed["healing"]) == healing
    for name in ("dense", first):  # not healed: the lineage and healing columns are empty
        assert rows[name]["parent"] == rows[name]["healing:method"] == rows[name]["healing"] == ""


def test_rm_removes_variants_and_optionally_their_checkpoints(populated):
    url, (first, second) = populated["url"], populated["names"]
    code, _, err = run_cli("variants", "rm", second, "no-such-variant", "--registry", url)
    assert code == 2 and "no-such-variant" in err
    with open_registry(url) as registry:
        assert len(registry.list_variants()) == 2  # a typo in one name removes nothing
    code, out, _ = run_cli(
        "variants", "rm", first, second, "--delete-checkpoint", "--registry", url, "--json"
    )
    assert code == 0 and [entry["name"] for entry in json.loads(out)] == [first, second]
    assert not populated["checkpoint"].exists()
    with open_registry(url) as registry:
        assert registry.list_variants() == []


@pytest.mark.parametrize(
    "argv, message",
    [
        (("show", "nope"), "error: no variant or alias named 'nope'"),
        (("rm", "dense"), "error: 'dense' is the dense base model"),
        (("rm", "ppl-best"), "error: 'ppl-best' is an alias of"),
        (("export", "--format", "xml"), "error: --format must be one of json, csv"),
        (("alias", "x", "--delete", "dense"), "error: --delete takes the alias only"),
        (("list", "--base", "org/Unknown"), "error: base model 'org/Unknown' is not registered"),
    ],
)
def test_bad_input_is_one_error_line_and_exit_2(populated, argv, message):
    code, out, err = run_cli("variants", *argv, "--registry", populated["url"])
    assert code == 2 and err.startswith(message) and err.count("\n") == 1


def test_a_registry_url_that_does_not_connect_is_one_error_line():
    code, _, err = run_cli("variants", "list", "--registry", "postgresql+psycopg://u:pw@127.0.0.1:1/x")
    assert code == 2 and err.startswith(
        "error: cannot connect to the registry at postgresql+psycopg://u:***@"
    )
    assert err.count("\n") == 1


def test_the_environment_names_the_default_registry(populated, monkeypatch):
    monkeypatch.setenv("DEPTHPRUNE_REGISTRY_URL", populated["url"])
    code, out, _ = run_cli("variants", "list", "--json", "--no-dense")
    assert code == 0 and len(json.loads(out)) == 2


def test_compare_keeps_every_label_whole_beside_a_value_wider_than_the_terminal(populated):
    """A value too long for the 240-column table (here a calibration file's long path) folds onto more lines;
    the row labels stay whole and nothing is cut to an ellipsis."""
    long_data = "text:/" + "/".join(["a-rather-long-directory-name"] * 12) + "/traffic.jsonl"
    with open_registry(populated["url"]) as registry:
        variant = register_example_variant(
            registry,
            [4, 6],
            base_model=BASE,
            calibration={"objective": "ppl", "data": long_data, "samples": 8, "seq_len": 128, "seed": 0},
            search="one_shot",
        )
    code, out, _ = run_cli("variants", "compare", "dense", variant.name, "--registry", populated["url"])
    assert code == 0 and "…" not in out
    assert all(f"│ {label}" in out for label in ("removed", "samples × seq_len", "calibration loss"))
    assert "traffic.jsonl" in out
