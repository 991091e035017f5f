"""Pruned checkpoints: parity with the dense model run with blocks skipped, in transformers and in vLLM."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from depthprune.testing.generation import transformers_greedy, vllm_greedy
from ground.core.checksums import weights_sha256
from ground.core.errors import UserError
from pruning.model.blocks import BlockStack
from pruning.model.checkpoint import PrunedCheckpoint, staged_directory, write_pruned_checkpoint
from registry.records import VariantRecord

ARCHITECTURES = ["llama", "qwen3", "mistral", "gemma3_text"]
REMOVAL_SETS = [[1, 4], [0, 2, 5], [3]]
PROMPTS = [[5, 6, 7, 8, 9], [40, 41, 42], [200, 13, 77, 90, 4, 18]]


@pytest.mark.parametrize("architecture", ARCHITECTURES)
@pytest.mark.parametrize("removed", REMOVAL_SETS)
def test_saved_checkpoint_logits_equal_dense_with_blocks_skipped(
    tiny_model_dirs, tmp_path, architecture, removed
):
    base = tiny_model_dirs(architecture)
    written = write_pruned_checkpoint(str(base), removed, tmp_path / "variant")

    dense = BlockStack(AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval())
    variant = AutoModelForCausalLM.from_pretrained(written.path, dtype=torch.float32).eval()
    input_ids = torch.randint(4, 256, (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = dense.forward(input_ids, removed)
        actual = variant(input_ids, use_cache=False).logits
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
    assert variant.config.num_hidden_layers == 6 - len(removed)


def test_written_metadata(tiny_model_dirs, tmp_path):
    base = tiny_model_dirs("gemma3_text")
    original_types = AutoConfig.from_pretrained(base).layer_types
    written = write_pruned_checkpoint(
        str(base), [4, 0], tmp_path / "variant", calibration={"objective": "perplexity"}, scores={"loss": 1.5}
    )
    directory = Path(written.path)
    config = AutoConfig.from_pretrained(directory)
    assert config.layer_types == [original_types[i] for i in [1, 2, 3, 5]]
    recorded = PrunedCheckpoint.read(directory)
    assert recorded.removed_blocks == [0, 4]
    assert recorded.kept_to_original == [1, 2, 3, 5]
    assert recorded.base_weights_sha256 == weights_sha256(base)
    assert recorded.weights_sha256 == weights_sha256(directory)
    assert recorded.calibration == {"objective": "perplexity"} and recorded.scores == {"loss": 1.5}
    assert recorded.variant.search == "manual" and recorded.variant.removed_blocks == [0, 4]
    assert recorded.variant.checkpoint_path == written.path
    assert f"base_model: {base}" in (directory / "README.md").read_text()
    assert AutoTokenizer.from_pretrained(directory).eos_token == "</s>"
    assert (directory / "generation_config.json").is_file()


def test_pruning_json_carries_the_variant_record(tiny_model_dirs, tmp_path):
    base = str(tiny_model_dirs("llama"))
    record = VariantRecord(
        base_model=base,
        removed_blocks=[3, 1],
        calibration={"objective": "perplexity", "samples": 4},
        search="greedy",
        search_options={"width": 2, "seed": 7},
        calibration_loss=1.5,
        subset_evaluations=9,
    )
    written = write_pruned_checkpoint(base, [1, 3], tmp_path / "variant", variant=record)
    expected = dataclasses.replace(
        record, checkpoint_path=written.path, checkpoint_sha256=written.weights_sha256
    )
    assert written.variant == expected and PrunedCheckpoint.read(written.path).variant == expected
    pruning_file = Path(written.path) / "pruning.json"
    stored = json.loads(pruning_file.read_text())
    assert stored["variant"] == dataclasses.asdict(expected)
    # The keys older readers know repeat the record.
    assert stored["calibration"] == record.calibration and stored["removed_blocks"] == [1, 3]
    assert stored["scores"]["search"] == "greedy" and stored["scores"]["search_options"] == {"width": 2}
    assert stored["scores"]["seed"] == 7 and stored["scores"]["calibration_loss"] == 1.5
    # A pruning.json written before the record was: it is rebuilt from the calibration and the scores.
    del stored["variant"]
    pruning_file.write_text(json.dumps(stored))
    assert PrunedCheckpoint.read(written.path).variant == expected
    with pytest.raises(ValueError, match="the variant record describes"):
        write_pruned_checkpoint(base, [1, 4], tmp_path / "other", variant=record)
    assert not (tmp_path / "other").exists()


def test_qwen_max_window_layers_follows_kept_blocks(tmp_path):
    from transformers import Qwen3Config

    from pruning.model.checkpoint import slice_per_layer_config

    config = Qwen3Config(num_hidden_layers=6, use_sliding_window=True, sliding_window=8, max_window_layers=3)
    assert config.layer_types[2:4] == ["full_attention", "sliding_attention"]
    slice_per_layer_config(config, [0, 2, 3, 5])
    assert config.num_hidden_layers == 4
    assert config.max_window_layers == 2
    assert config.layer_types == ["full_attention"] * 2 + ["sliding_attention"] * 2


@pytest.mark.parametrize(
    "remove, message",
    [
        ("1,9", "out of range"),
        ("2,2", "duplicate"),
        ("0,1,2,3,4,5", "at least one"),
        ("a,b", "integers"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(tiny_model_dirs, tmp_path, run_cli, remove, message):
    out, base = tmp_path / "variant", tiny_model_dirs("llama")
    code, _, error = run_cli("checkpoint", "--model", base, "--remove", remove, "--out", out)
    assert code == 2
    assert message in error and len(error.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


def test_path_that_is_not_a_model(tmp_path, run_cli):
    (tmp_path / "empty").mkdir()
    code, _, error = run_cli(
        "checkpoint", "--model", tmp_path / "empty", "--remove", "1", "--out", tmp_path / "o"
    )
    assert code == 2 and "is not a model" in error
    assert not (tmp_path / "o").exists()
    with pytest.raises(UserError, match="not a model directory"):
        write_pruned_checkpoint("./does-not-exist", [1], tmp_path / "o")


def test_existing_output_is_not_clobbered(tiny_model_dirs, tmp_path):
    out = tmp_path / "variant"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(UserError, match="already exists"):
        write_pruned_checkpoint(str(tiny_model_dirs("llama")), [1], out)
    assert (out / "keep.txt").read_text() == "mine"
    write_pruned_checkpoint(str(tiny_model_dirs("llama")), [1], out, overwrite=True)
    assert not (out / "keep.txt").exists() and (out / "pruning.json").is_file()


def test_identical_weights_share_their_files_and_survive_each_others_deletion(tiny_model_dirs, tmp_path):
    import shutil

    base = str(tiny_model_dirs("llama"))
    first = write_pruned_checkpoint(base, [1, 4], tmp_path / "greedy-seed0")
    same = write_pruned_checkpoint(base, [4, 1], tmp_path / "beam-seed0")
    other = write_pruned_checkpoint(base, [1, 3], tmp_path / "genetic-seed0")
    weights = "model.safetensors"
    inode = (Path(first.path) / weights).stat().st_ino
    assert (Path(same.path) / weights).stat().st_ino == inode  # one copy on disk
    assert (Path(other.path) / weights).stat().st_ino != inode
    assert not list(Path(same.path).glob(".*.link"))
    shutil.rmtree(first.path)  # deleting one checkpoint leaves the other whole
    assert weights_sha256(same.path) == same.weights_sha256
    AutoModelForCausalLM.from_pretrained(same.path)


def test_staged_directory_replaces_on_success_and_leaves_nothing_on_failure(tmp_path):
    out = tmp_path / "nested" / "checkpoint"
    with staged_directory(out) as staging:
        assert staging.parent == out.parent and not out.exists()
        (staging / "weights").write_text("first")
    assert (out / "weights").read_text() == "first"
    with pytest.raises(KeyboardInterrupt), staged_directory(out) as staging:
        (staging / "weights").write_text("half")
        raise KeyboardInterrupt
    assert (out / "weights").read_text() == "first"
    assert sorted(path.name for path in out.parent.iterdir()) == ["checkpoint"]  # no staging left behind
    with staged_directory(out) as staging:
        (staging / "other").write_text("second")
    assert sorted(path.name for path in out.iterdir()) == ["other"]


def test_cli_json(tiny_model_dirs, tmp_path, run_cli):
    code, out, _ = run_cli(
        "checkpoint",
        "--model",
        tiny_model_dirs("qwen3"),
        "--remove",
        "3,1",
        "--out",
        tmp_path / "v",
        "--json",
    )
    assert code == 0
    record = json.loads(out.strip().splitlines()[-1])
    assert record["removed_blocks"] == [1, 3] and record["kept_to_original"] == [0, 2, 4, 5]
    assert record["variant"] is None  # chosen by hand: no calibration to file it under


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_greedy_tokens_equal_transformers(tiny_model_dirs, tmp_path):
    """vLLM (real CPU engine) loads every saved variant and generates transformers' greedy tokens."""
    variants = {}
    for architecture, removed in zip(ARCHITECTURES, [[1, 4], [0, 2, 5], [1, 3], [0, 4]]):
        variants[architecture] = write_pruned_checkpoint(
            str(tiny_model_dirs(architecture)), removed, tmp_path / architecture
        ).path
    max_tokens = 8
    generated = vllm_greedy(list(variants.values()), PROMPTS, max_tokens, work_dir=tmp_path)
    for architecture, directory in variants.items():
        model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
        for prompt, vllm_tokens in zip(PROMPTS, generated[str(directory)]):
            expected, gaps = transformers_greedy(model, prompt, max_tokens)
            for step, (ours, theirs) in enumerate(zip(vllm_tokens, expected)):
                if ours != theirs:
                    # Random tiny models can have near-ties; a flip there is float noise, not a bug.
                    assert gaps[step] < 1e-4, (architecture, prompt, step, vllm_tokens, expected)
                    break
            else:
                assert len(vllm_tokens) == max_tokens
