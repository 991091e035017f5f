"""``depthprune heal``: training lowers the loss, the merged checkpoint equals the adapted model, Ctrl-C and a
re-run give the same weights, the registry keeps the lineage, bad input is one line, vLLM loads the result.

Everything runs on the tiny demo model (8 blocks, hidden 64) with a hand-pruned variant of it.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM

from depthprune.testing.generation import transformers_greedy, vllm_greedy
from ground.core.checksums import weights_sha256
from ground.core.errors import UserError
from ground.core.settings import home_dir
from pruning.calibration.data.sampling import text_windows
from pruning.calibration.data.specs import load_documents
from pruning.healing.config import HealConfig
from pruning.healing.heal import PARENT_RECORD_FIELDS, heal, plan_heal
from pruning.healing.losses import teacher_top_k, token_losses
from pruning.healing.merge import merged_model, write_healed_checkpoint
from pruning.healing.train import trainable_model
from pruning.model.checkpoint import PrunedCheckpoint, write_pruned_checkpoint
from registry import open_registry
from registry.records import VariantRecord

REMOVED = [2, 5, 6]
TRAINING = ["--steps", "20", "--lr", "1e-2", "--batch-size", "4", "--seq-len", "64", "--lora-rank", "4"]
"""A few quick steps that visibly lower the tiny model's loss."""
PROMPTS = [[5, 6, 7, 8, 9], [40, 41, 42], [200, 13, 77, 90, 4, 18]]


@pytest.fixture(scope="module")
def parent(demo_tiny_dir, tmp_path_factory):
    """A registered variant of the tiny demo model without blocks 2, 5 and 6: ``(name, demo data spec)``."""
    model = str(demo_tiny_dir)
    data = f"demo:text@{model}"
    record = VariantRecord(
        base_model=model,
        removed_blocks=REMOVED,
        calibration={"objective": "perplexity", "data": data, "samples": 8, "seq_len": 64, "seed": 0},
        search="manual",
        calibration_loss=5.0,
    )
    written = write_pruned_checkpoint(
        model, REMOVED, tmp_path_factory.mktemp("parent") / "variant", variant=record
    )
    with open_registry() as registry:
        registry.register_base_model(
            model,
            revision=None,
            weights_sha256=written.base_weights_sha256,
            num_blocks=written.base_num_blocks,
            architecture=written.architecture,
        )
        variant = registry.register_variant(written.variant)
    return variant.name, data


@pytest.fixture(scope="module")
def healed(parent, tmp_path_factory):
    """``depthprune heal PARENT --method lora --json``: the JSON line it printed."""
    name, data = parent
    out = tmp_path_factory.mktemp("healed")
    code, stdout, stderr = run_heal(name, "--data", data, *TRAINING, "--out", out, "--json")
    assert code == 0, stderr[-3000:]
    lines = stdout.strip().splitlines()
    assert len(lines) == 1
    return json.loads(lines[0])


def run_heal(*args):
    from depthprune.testing.cli import run_cli

    return run_cli("heal", *args)


def tokenizer_of(directory):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(directory)


def mean_nll(directory: str, windows: list[list[int]]) -> float:
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    with torch.no_grad():
        nll, _ = token_losses(model, torch.tensor(windows))
    return float(nll)


def heal_runs() -> set[Path]:
    return set((home_dir() / "runs").glob("heal-*"))


# ------------------------------------------------------------------------------------------------ training


@pytest.mark.slow
def test_a_few_steps_lower_the_training_and_held_out_loss(parent, healed, demo_tiny_dir):
    name, data = parent
    assert set(healed) >= {"id", "name", "checkpoint", "parent", "losses"}
    assert healed["parent"] == name
    losses = healed["losses"]
    assert losses["heldout"] < losses["heldout_before"]
    # The same training windows before and after: the loss the steps descended.
    windows = text_windows(load_documents(data, "calibration"), tokenizer_of(demo_tiny_dir), 64)[:16]
    with open_registry() as registry:
        parent_dir = registry.resolve(name).checkpoint_path
    assert mean_nll(healed["checkpoint"], windows) < mean_nll(parent_dir, windows) - 0.02


@pytest.mark.slow
def test_the_checkpoint_has_the_parents_shape_and_records_the_healing(parent, healed):
    name, data = parent
    with open_registry() as registry:
        parent_info = registry.resolve(name)
    checkpoint = Path(healed["checkpoint"])
    parent_weights = load_file(Path(parent_info.checkpoint_path) / "model.safetensors")
    healed_weights = load_file(checkpoint / "model.safetensors")
    assert {key: value.shape for key, value in healed_weights.items()} == {
        key: value.shape for key, value in parent_weights.items()
    }
    assert not torch.equal(
        healed_weights["model.layers.0.self_attn.q_proj.weight"],
        parent_weights["model.layers.0.self_attn.q_proj.weight"],
    )
    assert AutoConfig.from_pretrained(checkpoint).num_hidden_layers == 8 - len(REMOVED)
    assert not list(checkpoint.parent.glob(".*partial*"))
    written = PrunedCheckpoint.read(checkpoint)
    assert written.removed_blocks == REMOVED and written.weights_sha256 == weights_sha256(checkpoint)
    assert written.variant.parent == name and written.variant.checkpoint_path == str(checkpoint)
    healing = written.variant.healing
    for key in ("method", "data", "steps", "seed", "hyperparameters", "wall_seconds", "train_loss"):
        assert key in healing, key
    assert healing["method"] == "lora" and healing["data"] == data and healing["steps"] == 20
    assert healing["train_split"] == "calibration" and healing["eval_split"] == "test"
    assert (
        healing["hyperparameters"]["lora_rank"] == 4
        and healing["heldout_loss"] == healed["losses"]["heldout"]
    )
    for field in PARENT_RECORD_FIELDS:
        assert getattr(written.variant, field) == getattr(parent_info, field), field


@pytest.mark.slow
def test_the_registry_stores_and_shows_the_lineage(parent, healed, run_cli):
    name, _ = parent
    with open_registry() as registry:
        child = registry.resolve(healed["name"])
        assert child.id == healed["id"] and child.parent == name
        assert child.parent_id == registry.resolve(name).id
        assert child.removed_blocks == REMOVED and child.healing["method"] == "lora"
        assert child.checkpoint_path == healed["checkpoint"]
        registry.verify_checkpoint(child)
        assert [item.name for item in registry.healed_from(name)] == [healed["name"]]
    code, out, _ = run_cli("variants", "show", healed["name"], "--json")
    assert code == 0 and json.loads(out)["variant"]["parent"] == name
    code, out, _ = run_cli("variants", "show", name, "--json")
    assert json.loads(out)["healed_variants"] == [healed["name"]]
    code, out, _ = run_cli("variants", "show", healed["name"])
    assert code == 0 and "healed from" in out and name in out
    code, out, _ = run_cli("variants", "compare", name, healed["name"])
    assert code == 0 and "healed from" in out and "held-out loss" in out
    code, _, err = run_cli("variants", "alias", "tiny-healed", healed["name"])
    assert code == 0, err
    with open_registry() as registry:
        assert registry.resolve("tiny-healed").name == healed["name"]


@pytest.mark.slow
def test_healing_again_with_the_same_settings_reuses_the_finished_run(parent, healed, tmp_path):
    name, data = parent
    code, stdout, stderr = run_heal(
        name, "--data", data, *TRAINING, "--out", Path(healed["checkpoint"]).parent, "--json"
    )
    assert code == 0, stderr[-3000:]
    again = json.loads(stdout)
    assert again == healed
    assert "heal lora" not in stderr  # no training progress bar: nothing was trained


@pytest.mark.slow
def test_distillation_with_top_k_lowers_its_loss(parent, tmp_path):
    name, data = parent
    code, stdout, stderr = run_heal(
        name,
        "--data",
        data,
        "--method",
        "distill",
        "--distill-top-k",
        "16",
        "--lm-loss-weight",
        "0.5",
        "--steps",
        "12",
        "--lr",
        "3e-3",
        "--batch-size",
        "4",
        "--seq-len",
        "64",
        "--out",
        tmp_path,
        "--json",
    )
    assert code == 0, stderr[-3000:]
    outcome = json.loads(stdout)
    assert outcome["losses"]["train"] < outcome["losses"]["train_first"]
    healing = PrunedCheckpoint.read(outcome["checkpoint"]).variant.healing
    assert healing["method"] == "distill"
    assert (
        healing["hyperparameters"]["distill_top_k"] == 16
        and healing["hyperparameters"]["lm_loss_weight"] == 0.5
    )


@pytest.mark.slow
def test_a_full_fine_tune_changes_only_the_blocks(parent, tmp_path):
    name, data = parent
    code, stdout, stderr = run_heal(
        name,
        "--data",
        data,
        "--method",
        "distill",
        "--full-finetune",
        "--steps",
        "3",
        "--lr",
        "1e-3",
        "--batch-size",
        "2",
        "--seq-len",
        "32",
        "--out",
        tmp_path,
        "--json",
    )
    assert code == 0, stderr[-3000:]
    outcome = json.loads(stdout)
    with open_registry() as registry:
        before = load_file(Path(registry.resolve(name).checkpoint_path) / "model.safetensors")
    after = load_file(Path(outcome["checkpoint"]) / "model.safetensors")
    changed = {key for key in before if not torch.equal(before[key], after[key])}
    assert changed and all(key.startswith("model.layers.") for key in changed)


def test_top_k_distillation_is_the_exact_kl_when_k_covers_the_vocabulary(tiny_model_dirs):
    directory = tiny_model_dirs("llama")
    teacher = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    student = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    with torch.no_grad():
        for parameter in student.model.layers[1].parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    input_ids = torch.randint(4, 256, (2, 24), generator=torch.Generator().manual_seed(0))
    vocabulary = teacher.config.vocab_size
    with torch.no_grad():
        _, exact_kl = token_losses(student, input_ids, teacher_top_k(teacher, input_ids, vocabulary))
        _, top_kl = token_losses(student, input_ids, teacher_top_k(teacher, input_ids, 8))
        log_p = torch.log_softmax(teacher(input_ids).logits[:, :-1].float(), -1)
        log_q = torch.log_softmax(student(input_ids).logits[:, :-1].float(), -1)
        reference = (log_p.exp() * (log_p - log_q)).sum(-1).mean()
    torch.testing.assert_close(exact_kl, reference, rtol=1e-4, atol=1e-6)
    assert 0 <= float(top_kl) <= float(exact_kl) + 1e-6


# ------------------------------------------------------------------------------------------ merge, resume


def test_merged_checkpoint_logits_equal_the_adapted_model(parent, tmp_path):
    name, data = parent
    with open_registry() as registry:
        info = registry.resolve(name)
    parent_dir = Path(info.checkpoint_path)
    causal_lm = AutoModelForCausalLM.from_pretrained(parent_dir, dtype=torch.float32).eval()
    adapted = trainable_model(causal_lm, HealConfig(variant=name, data=data, lora_rank=4, seed=1))
    with torch.no_grad():  # LoRA's B starts at zero: give the adapters something to merge
        for parameter_name, parameter in adapted.named_parameters():
            if "lora_B" in parameter_name:
                parameter.normal_(0, 0.05, generator=torch.Generator().manual_seed(len(parameter_name)))
    input_ids = torch.randint(4, 500, (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = adapted(input_ids=input_ids).logits
        unadapted = AutoModelForCausalLM.from_pretrained(parent_dir, dtype=torch.float32)(input_ids).logits
    assert not torch.allclose(expected, unadapted, atol=1e-3)
    record = VariantRecord(
        **{field: getattr(info, field) for field in PARENT_RECORD_FIELDS},
        parent=name,
        healing={"method": "lora", "data": data, "train_split": "calibration", "steps": 0, "seed": 1},
    )
    tokenizer = tokenizer_of(parent_dir)
    written = write_healed_checkpoint(
        merged_model(adapted), tokenizer, parent_dir, tmp_path / "merged", record
    )
    merged = AutoModelForCausalLM.from_pretrained(written.path, dtype=torch.float32).eval()
    with torch.no_grad():
        actual = merged(input_ids).logits
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
    assert not any("lora" in key for key in load_file(Path(written.path) / "model.safetensors"))


@pytest.mark.slow
def test_an_interrupted_run_resumes_to_the_same_weights(parent, tmp_path):
    name, data = parent
    settings = dict(variant=name, data=data, steps=8, lr=1e-2, batch_size=2, seq_len=32, lora_rank=4, seed=3)
    uninterrupted = heal(HealConfig(**settings, out=tmp_path / "a", progress=False))
    with open_registry() as registry:
        run_dir = plan_heal(HealConfig(**settings), registry).run_dir
        variants_before = len(registry.list_variants())
    shutil.rmtree(run_dir)  # forget the finished run, so that the next one trains again

    with pytest.raises(KeyboardInterrupt):
        heal(HealConfig(**settings, out=tmp_path / "b", progress=False, stop_after=3))
    assert (run_dir / "state.pt").is_file()
    assert not (tmp_path / "b").exists() or not any((tmp_path / "b").iterdir())
    with open_registry() as registry:
        assert len(registry.list_variants()) == variants_before
    code, stdout, stderr = run_heal(
        name,
        "--data",
        data,
        "--steps",
        "8",
        "--lr",
        "1e-2",
        "--batch-size",
        "2",
        "--seq-len",
        "32",
        "--lora-rank",
        "4",
        "--seed",
        "3",
        "--out",
        tmp_path / "b",
        "--json",
    )
    assert code == 0, stderr[-3000:]
    resumed = json.loads(stdout)
    assert "3/8" in stderr  # the progress bar started where the interrupted run stopped
    first = load_file(Path(uninterrupted.checkpoint) / "model.safetensors")
    second = load_file(Path(resumed["checkpoint"]) / "model.safetensors")
    assert first.keys() == second.keys()
    for key in first:
        assert torch.equal(first[key], second[key]), key
    assert resumed["losses"]["train"] == uninterrupted.losses["train"]
    assert not (run_dir / "state.pt").exists() and (run_dir / "done.json").is_file()


# -------------------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("variant", "extra", "message"),
    [
        ("no-such-variant", [], "no variant or alias named 'no-such-variant'"),
        ("dense", [], "is the dense base model"),
        (None, ["--data", "QA"], "multiple-choice data"),
        (None, ["--steps", "0"], "--steps must be an integer >= 1"),
        (None, ["--steps", "-5"], "--steps must be an integer >= 1"),
        (None, ["--lora-rank", "65"], "larger than the hidden size 64"),
        (None, ["--method", "finetune"], "--method must be one of lora, distill"),
        (None, ["--distill-top-k", "8"], "--distill-top-k applies to --method distill only"),
        (None, ["--data", "FILE"], "is the same as the held-out text"),
        (None, ["--lora-targets", "q_proj,qkv"], "'qkv' is not a linear module of the blocks"),
    ],
)
def test_bad_input_is_one_line_and_leaves_nothing(parent, demo_tiny_dir, tmp_path, variant, extra, message):
    name, data = parent
    text_file = tmp_path / "text.txt"
    text_file.write_text("A few words of text.\n\nAnd a second document, with more words in it.\n")
    substitutes = {"QA": f"demo:qa@{demo_tiny_dir}", "FILE": f"text:{text_file}"}
    extra = [substitutes.get(item, item) for item in extra]
    with open_registry() as registry:
        before = [item.to_dict() for item in registry.list_variants()]
    runs = heal_runs()
    code, stdout, stderr = run_heal(
        variant or name, "--data", data, "--seq-len", "8", *extra, "--out", tmp_path / "out"
    )
    lines = stderr.strip().splitlines()
    assert code == 2 and lines[-1].startswith("error: ") and message in lines[-1], stderr
    assert sum(line.startswith("error: ") for line in lines) == 1 and not stdout
    assert not (tmp_path / "out").exists()
    assert heal_runs() == runs
    with open_registry() as registry:
        assert [item.to_dict() for item in registry.list_variants()] == before


# ---------------------------------------------------------------------------------------- registry lineage


def test_lineage_records_are_checked_and_a_healed_variant_outlives_its_parent(tmp_path):
    with open_registry(f"sqlite:///{tmp_path / 'registry.db'}") as registry:
        registry.register_base_model(
            "org/tiny", revision=None, weights_sha256="b" * 64, num_blocks=8, architecture="llama"
        )
        fields = dict(
            base_model="org/tiny", removed_blocks=[1, 2], calibration={"objective": "ppl"}, search="greedy"
        )
        first = registry.register_variant(VariantRecord(**fields))
        other = registry.register_variant(VariantRecord(**{**fields, "removed_blocks": [3]}))
        healing = {"method": "lora", "steps": 10, "train_loss": 2.0}
        child = registry.register_variant(VariantRecord(**fields, parent=first.name, healing=healing))
        assert child.id != first.id and child.parent == first.name and child.name.startswith(first.name)
        # Same settings, other measurements: the same healed variant, updated.
        again = registry.register_variant(
            VariantRecord(**fields, parent=first.name, healing={**healing, "train_loss": 1.5})
        )
        assert again.id == child.id and again.healing["train_loss"] == 1.5
        longer = registry.register_variant(
            VariantRecord(**fields, parent=first.name, healing={**healing, "steps": 20})
        )
        assert longer.id != child.id
        for parent, message in (("dense", "not the dense model"), (other.name, "keeps its parent's blocks")):
            with pytest.raises(UserError, match=message):
                registry.register_variant(VariantRecord(**fields, parent=parent, healing=healing))
        with pytest.raises(UserError, match="both its parent and its healing record"):
            VariantRecord(**fields, parent=first.name)
        registry.remove_variant(first.name)
        orphan = registry.resolve(child.name)
        assert orphan.parent is None and orphan.healing["method"] == "lora"


def test_an_older_record_without_lineage_reads_back_as_before(tmp_path):
    fields = dict(
        base_model="org/tiny", removed_blocks=[2, 1], calibration={"objective": "ppl"}, search="greedy"
    )
    record = VariantRecord(**fields)
    assert record.parent is None and record.healing is None and record.healing_settings() is None
    stored = dataclasses.asdict(record)
    assert (
        VariantRecord(**{key: value for key, value in stored.items() if key not in ("parent", "healing")})
        == record
    )


# ---------------------------------------------------------------------------------------------------- vLLM


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_greedy_tokens_on_the_healed_checkpoint_equal_transformers(healed, tmp_path):
    max_tokens = 8
    generated = vllm_greedy([healed["checkpoint"]], PROMPTS, max_tokens, tmp_path)[healed["checkpoint"]]
    model = AutoModelForCausalLM.from_pretrained(healed["checkpoint"], dtype=torch.float32).eval()
    for prompt, vllm_tokens in zip(PROMPTS, generated):
        expected, gaps = transformers_greedy(model, prompt, max_tokens)
        assert len(vllm_tokens) == max_tokens
        for step, (ours, theirs) in enumerate(zip(vllm_tokens, expected)):
            if ours != theirs:
                # A near-tie may flip on float noise; anything else is a real difference.
                assert gaps[step] < 1e-4, (prompt, step, vllm_tokens, expected)
                break
