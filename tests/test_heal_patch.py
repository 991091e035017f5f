"""``depthprune heal --method patch`` (ReplaceMe's training-free linear map) and ``--method last-blocks``.

The patch's activations are checked against an independent reading of the dense model (transformers'
``output_hidden_states`` and a hook on the MLP, as ReplaceMe's own code reads them), the fused child against
"parent + explicit map" (a hook multiplying the MLP output), and the command end to end: lineage, shape,
transformers loading, refusals. Everything runs on the tiny demo model (8 blocks, hidden 64).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM

from ground.core.settings import home_dir
from pruning.calibration.config import CalibrationConfig
from pruning.calibration.scoring.build import build_evaluator
from pruning.healing.config import HealConfig
from pruning.healing.patch import (
    EMBEDDING,
    captured_output,
    fuse_map,
    gather_statistics,
    least_squares_map,
    removed_spans,
)
from pruning.model.checkpoint import PrunedCheckpoint, write_pruned_checkpoint
from pruning.pipeline.heldout import HeldOut
from registry import open_registry
from registry.records import VariantRecord

REMOVED = [2, 5, 6]
"""Two spans: [2, 3) patched into block 1, [5, 7) patched into block 4 (the variant's blocks 1 and 3)."""
QUICK = ["--seq-len", "32", "--batch-size", "4", "--patch-samples", "16", "--eval-windows", "4"]


def run_heal(*args):
    from depthprune.testing.cli import run_cli

    return run_cli("heal", *args)


def register_variant(model: str, removed: list[int], directory: Path) -> str:
    record = VariantRecord(
        base_model=model,
        removed_blocks=removed,
        calibration={"objective": "perplexity", "data": f"demo:text@{model}", "samples": 8, "seq_len": 32},
        search="manual",
        calibration_loss=5.0,
    )
    written = write_pruned_checkpoint(model, removed, directory, variant=record)
    with open_registry() as registry:
        registry.register_base_model(
            model,
            revision=None,
            weights_sha256=written.base_weights_sha256,
            num_blocks=written.base_num_blocks,
            architecture=written.architecture,
        )
        return registry.register_variant(written.variant).name


@pytest.fixture(scope="module")
def parent(demo_tiny_dir, tmp_path_factory):
    """A registered variant of the tiny demo model without blocks 2, 5 and 6: ``(name, data spec)``."""
    model = str(demo_tiny_dir)
    return register_variant(model, REMOVED, tmp_path_factory.mktemp("parent") / "v"), f"demo:text@{model}"


@pytest.fixture(scope="module")
def patched(parent, tmp_path_factory):
    name, data = parent
    code, stdout, stderr = run_heal(
        name, "--data", data, "--method", "patch", *QUICK, "--out", tmp_path_factory.mktemp("out"), "--json"
    )
    assert code == 0, stderr[-3000:]
    return json.loads(stdout)


def windows_of(data: str, directory, count: int = 6) -> list[list[int]]:
    from transformers import AutoTokenizer

    from pruning.calibration.data.sampling import text_windows
    from pruning.calibration.data.specs import load_documents

    return text_windows(load_documents(data, "calibration"), AutoTokenizer.from_pretrained(directory), 32)[
        :count
    ]


def test_spans_are_the_maximal_runs_of_removed_blocks():
    spans = removed_spans([6, 2, 5, 0])
    assert [span.as_list() for span in spans] == [[0, 1], [2, 3], [5, 7]]
    assert [span.before for span in spans] == [EMBEDDING, 1, 4]


def test_activations_are_replacemes_mlp_output_and_residual_corrected_target(parent, demo_tiny_dir):
    """X = MLP output of the block before the span; Y = h_{e-1} + X − h_{s-1} (ReplaceMe's lstsq.py)."""
    _, data = parent
    dense = AutoModelForCausalLM.from_pretrained(demo_tiny_dir, dtype=torch.float32).eval()
    windows = windows_of(data, demo_tiny_dir)
    spans = removed_spans(REMOVED)
    config = HealConfig(variant="v", data=data, method="patch", batch_size=4)
    statistics = gather_statistics(dense, windows, spans, config)
    for span, stats in zip(spans, statistics, strict=True):
        with torch.no_grad(), captured_output(dense.model.layers[span.before].mlp) as mlp:
            hidden_states = dense(torch.tensor(windows), output_hidden_states=True).hidden_states[1:]
        inputs = mlp[0].reshape(-1, 64).double()
        targets = (hidden_states[span.end - 1] + mlp[0] - hidden_states[span.before]).reshape(-1, 64).double()
        torch.testing.assert_close(stats.gram, inputs.T @ inputs, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(stats.cross, inputs.T @ targets, rtol=1e-5, atol=1e-6)
        # The same least-squares solution; the two routes' float32 activations differ by rounding only.
        expected = torch.linalg.lstsq(inputs, targets).solution
        torch.testing.assert_close(least_squares_map(stats, 0.0), expected, rtol=1e-3, atol=1e-4)


def test_the_cosine_estimator_raises_the_mean_cosine_from_the_identity(parent, demo_tiny_dir):
    from torch.nn import functional

    from pruning.healing.patch import cosine_map

    _, data = parent
    dense = AutoModelForCausalLM.from_pretrained(demo_tiny_dir, dtype=torch.float32).eval()
    config = HealConfig(variant="v", data=data, method="patch", estimator="cosine", lr=1e-2, batch_size=4)
    stats = gather_statistics(dense, windows_of(data, demo_tiny_dir), removed_spans([2]), config)[0]
    inputs, targets = stats.rows[0]

    def mean_cosine(transform):
        return float(functional.cosine_similarity(inputs @ transform.float(), targets, dim=1).mean())

    assert mean_cosine(cosine_map(stats, 1e-2, 0, "cpu")) > mean_cosine(torch.eye(64)) + 0.01


def test_fused_child_equals_parent_with_an_explicit_map(parent):
    """Folding T into down_proj gives the logits of the parent whose MLP output is multiplied by T."""
    name, _ = parent
    with open_registry() as registry:
        directory = registry.resolve(name).checkpoint_path
    checkpoint = PrunedCheckpoint.read(directory)
    spans = removed_spans(checkpoint.removed_blocks)
    generator = torch.Generator().manual_seed(0)
    maps = [
        torch.eye(64, dtype=torch.float64)
        + 0.1 * torch.randn(64, 64, generator=generator, dtype=torch.float64)
        for _ in spans
    ]
    explicit = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    fused = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    for span, transform in zip(spans, maps, strict=True):
        position = checkpoint.kept_to_original.index(span.before)
        explicit.model.layers[position].mlp.register_forward_hook(
            lambda _module, _inputs, output, t=transform: (output.double() @ t).float()
        )
        fuse_map(fused, checkpoint.kept_to_original, span, transform)
    input_ids = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12], [40, 41, 42, 43, 44, 45, 46, 47]])
    with torch.no_grad():
        torch.testing.assert_close(fused(input_ids).logits, explicit(input_ids).logits, rtol=1e-4, atol=1e-4)


def test_patch_child_has_the_parents_shape_loads_and_records_its_lineage(parent, patched):
    name, data = parent
    with open_registry() as registry:
        parent_dir = Path(registry.resolve(name).checkpoint_path)
        child = registry.resolve(patched["name"])
    assert patched["parent"] == name and child.parent == name and patched["method"] == "patch"
    parent_weights = load_file(parent_dir / "model.safetensors")
    child_weights = load_file(Path(patched["checkpoint"]) / "model.safetensors")
    assert {k: v.shape for k, v in child_weights.items()} == {k: v.shape for k, v in parent_weights.items()}
    changed = {key for key in parent_weights if not torch.equal(parent_weights[key], child_weights[key])}
    assert changed == {"model.layers.1.mlp.down_proj.weight", "model.layers.3.mlp.down_proj.weight"}
    parent_config, child_config = (
        AutoConfig.from_pretrained(parent_dir),
        AutoConfig.from_pretrained(patched["checkpoint"]),
    )
    assert child_config.to_dict() | {"_name_or_path": ""} == parent_config.to_dict() | {"_name_or_path": ""}
    model = AutoModelForCausalLM.from_pretrained(patched["checkpoint"])
    assert model.num_parameters() == AutoModelForCausalLM.from_pretrained(parent_dir).num_parameters()
    healing = child.healing
    assert healing["method"] == "patch" and healing["data"] == data and healing["steps"] == 0
    assert healing["hyperparameters"]["estimator"] == "lstsq" and healing["hyperparameters"]["ridge"] == 0.0
    assert [span["span"] for span in healing["spans"]] == [[2, 3], [5, 7]]
    assert all(0 <= span["relative_error"] < 1 for span in healing["spans"])
    assert healing["calibration_windows"] == 16 and healing["calibration_tokens"] == 16 * 32
    assert patched["losses"]["heldout_before"] == healing["parent_heldout_loss"]


def patch_healing(name: str, data: str, out: Path) -> dict:
    code, stdout, stderr = run_heal(name, "--data", data, "--method", "patch", *QUICK, "--out", out, "--json")
    assert code == 0, stderr[-3000:]
    with open_registry() as registry:
        return registry.resolve(json.loads(stdout)["name"]).healing


def test_a_leading_span_goes_into_an_untied_embedding(demo_tiny_dir, tmp_path):
    model = str(demo_tiny_dir)
    assert not AutoConfig.from_pretrained(model).tie_word_embeddings
    healing = patch_healing(register_variant(model, [0, 4], tmp_path / "v"), f"demo:text@{model}", tmp_path)
    assert [(span["span"], span["weight"]) for span in healing["spans"]] == [
        ([0, 1], "model.embed_tokens.weight"),
        ([4, 5], "model.layers.2.mlp.down_proj.weight"),
    ]
    assert healing["unpatched_spans"] == []


def test_a_leading_span_with_tied_embeddings_is_left_unpatched_and_recorded(
    tiny_model_dirs, demo_tiny_dir, tmp_path
):
    model = str(tiny_model_dirs("qwen3"))  # ties its embeddings
    name = register_variant(model, [0, 3], tmp_path / "v")
    healing = patch_healing(name, f"demo:text@{demo_tiny_dir}", tmp_path)
    assert [span["span"] for span in healing["spans"]] == [[3, 4]]
    assert healing["unpatched_spans"] == [{"span": [0, 1], "reason": "leading span with tied embeddings"}]


def test_an_architecture_that_normalises_the_mlp_output_is_refused(tiny_model_dirs, demo_tiny_dir, tmp_path):
    name = register_variant(str(tiny_model_dirs("gemma3_text")), [2], tmp_path / "v")
    code, _, stderr = run_heal(
        name, "--data", f"demo:text@{demo_tiny_dir}", "--method", "patch", "--out", tmp_path / "o"
    )
    assert code == 2 and "normalises before the residual" in stderr.strip().splitlines()[-1]
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_last_blocks_trains_only_the_head_and_the_last_blocks(parent, tmp_path):
    name, data = parent
    code, stdout, stderr = run_heal(
        name, "--data", data, "--method", "last-blocks", "--last-blocks", "2", "--steps", "3",
        "--seq-len", "32", "--batch-size", "4", "--eval-windows", "4", "--out", tmp_path, "--json",
    )  # fmt: skip
    assert code == 0, stderr[-3000:]
    outcome = json.loads(stdout)
    with open_registry() as registry:
        parent_dir = Path(registry.resolve(name).checkpoint_path)
    before = load_file(parent_dir / "model.safetensors")
    after = load_file(Path(outcome["checkpoint"]) / "model.safetensors")
    changed = {
        key.split(".")[2] if key.startswith("model.layers.") else key
        for key in before
        if not torch.equal(before[key], after[key])
    }
    assert changed <= {"3", "4", "lm_head.weight", "model.embed_tokens.weight"} and {"3", "4"} <= changed


def heal_runs() -> set[Path]:
    return set((home_dir() / "runs").glob("heal-*"))


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--method", "graft"], "--method must be one of lora, distill, last-blocks, patch"),
        (["--method", "patch", "--estimator", "svd"], "--estimator must be one of lstsq, cosine"),
        (
            ["--method", "patch", "--estimator", "cosine", "--ridge", "0.1"],
            "--ridge applies to --estimator lstsq",
        ),
        (["--method", "patch", "--patch-samples", "0"], "--patch-samples must be an integer >= 1"),
        (["--method", "patch", "--data", "QA"], "multiple-choice data"),
        (["--ridge", "0.1"], "--ridge applies to --method patch only"),
        (["--method", "last-blocks", "--last-blocks", "9"], "--last-blocks 9 is more than the 5 blocks"),
        (["--method", "patch", "--variant", "dense"], "is the dense base model"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(parent, demo_tiny_dir, tmp_path, extra, message):
    name, data = parent
    extra = [f"demo:qa@{demo_tiny_dir}" if item == "QA" else item for item in extra]
    if "--variant" in extra:
        name = extra[extra.index("--variant") + 1]
        extra = extra[: extra.index("--variant")]
    with open_registry() as registry:
        before = [item.to_dict() for item in registry.list_variants()]
    runs = heal_runs()
    code, stdout, stderr = run_heal(name, "--data", data, "--seq-len", "8", *extra, "--out", tmp_path / "out")
    lines = stderr.strip().splitlines()
    assert code == 2 and lines[-1].startswith("error: ") and message in lines[-1], stderr
    assert not stdout and not (tmp_path / "out").exists() and heal_runs() == runs
    with open_registry() as registry:
        assert [item.to_dict() for item in registry.list_variants()] == before


def test_a_healed_child_is_refused_for_a_patch(parent, patched, tmp_path):
    _, data = parent
    code, _, stderr = run_heal(patched["name"], "--data", data, "--method", "patch", "--out", tmp_path / "o")
    assert code == 2 and "was healed already" in stderr.strip().splitlines()[-1]
    assert not (tmp_path / "o").exists()


def test_prune_heal_patch_repairs_the_selected_variant(demo_tiny_dir, tmp_path):
    from depthprune.testing.cli import run_cli

    model = str(demo_tiny_dir)
    code, stdout, stderr = run_cli(
        "prune", "--model", model, "--objective", "perplexity", "--data", f"demo:text@{model}",
        "--samples", "4", "--seq-len", "32", "--drop", "2", "--search", "one_shot,block_influence",
        "--heal", "patch", "--out", tmp_path, "--json", "--dtype", "float32",
    )  # fmt: skip
    assert code == 0, stderr[-3000:]
    *variants, healed = (json.loads(line) for line in stdout.strip().splitlines())
    selected = [variant for variant in variants if variant["selected"]]
    assert healed["method"] == "patch" and [healed["parent"]] == [selected[0]["name"]]
    with open_registry() as registry:
        child = registry.resolve(healed["name"])
        parent = registry.resolve(child.parent)
    assert child.parent == selected[0]["name"] and child.healing["hyperparameters"]["seq_len"] == 32
    # The child's validation loss is the parent's validation scorer run on the child model (the checkpoint
    # as prune's evaluator loads it), on the parent's validation windows, against the parent's dense values.
    assert healed["validation_loss"] == child.quality["validation_loss"]
    assert (
        healed["parent_validation_loss"]
        == selected[0]["validation_loss"]
        == parent.quality["validation_loss"]
    )
    assert healed["selected"] == (healed["validation_loss"] < selected[0]["validation_loss"])
    assert child.quality["validation_data"] == parent.quality["validation_data"]
    assert child.quality["dense_perplexity"] == parent.quality["dense_perplexity"]
    assert child.fit == child.quality["fit"]
    assert "run's choice" in stderr and "variants alias --best perplexity" in stderr
    evaluator = build_evaluator(
        child.checkpoint_path, CalibrationConfig.from_record(parent.calibration), progress=False
    )
    scored = HeldOut(evaluator).dense  # the child scored whole, by the scorer prune gave its parent
    assert scored["validation_loss"] == pytest.approx(child.quality["validation_loss"], rel=1e-6, abs=1e-6)
    assert scored["perplexity"] == pytest.approx(child.quality["perplexity"], rel=1e-6)
    removed_again = HeldOut(build_evaluator(model, evaluator.config, progress=False)).quality(
        parent.removed_blocks
    )  # and the parent's own number is the same scorer's on the dense model without its blocks
    assert removed_again["validation_loss"] == pytest.approx(parent.quality["validation_loss"], rel=1e-6)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--heal", "lora"], "--heal must be one of patch"),
        (["--heal", "patch", "--heal-data", "QA"], "is multiple-choice: pass --heal-data"),
        (["--heal-data", "pydoc"], "--heal-data applies with --heal patch only"),
    ],
)
def test_prune_heal_refuses_what_it_cannot_run_before_pruning(demo_tiny_dir, tmp_path, extra, message):
    from depthprune.testing.cli import run_cli

    model = str(demo_tiny_dir)
    extra = [f"demo:qa@{model}" if item == "QA" else item for item in extra]
    code, stdout, stderr = run_cli(
        "prune", "--model", model, "--objective", "perplexity", "--data", f"demo:text@{model}",
        "--samples", "4", "--seq-len", "32", "--drop", "2", "--search", "one_shot", *extra, "--out", tmp_path,
    )  # fmt: skip
    assert code == 2 and message in stderr.strip().splitlines()[-1] and not stdout
    assert not any(tmp_path.iterdir())


def test_heal_help_names_every_method():
    from depthprune.testing.cli import run_cli

    code, stdout, _ = run_cli("heal", "--help")
    assert code == 0
    for word in ("lora", "distill", "last-blocks", "patch", "--estimator", "--ridge", "--patch-samples"):
        assert word in stdout


def test_the_plan_counts_the_dense_model_and_the_normal_equations():
    from depthprune.testing.models import tiny_config
    from ground.planning import HealSizes, plan_devices, plan_heal

    config = tiny_config("llama").to_dict()
    sizes = HealSizes(method="patch", batch_size=2, seq_len=16, patch_spans=2, patch_keeps_rows=True)
    plan = plan_heal(config, config, "tiny", "float32", plan_devices("cpu", None, None), sizes)
    names = " ".join(item.name for step in plan.steps for item in step.items)
    assert "dense model weights" in names and "normal equations" in names and "cosine" in names
