"""A GGUF of another architecture than the embedded Llama-family SmolLM2 prunes and checkpoints exactly.

The files are written by the ``gguf`` package from tiny random Qwen2 (attention biases) and Qwen3 (q/k norms,
tied embeddings, heads narrower than the config class's default) models: ``prune`` runs from the file
through its converted checkpoint, and the variant it writes must hold exactly the kept blocks of the
source, renumbered, with the config updated, and give the logits of the source with those blocks skipped.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from depthprune.testing.gguf_files import write_tiny_gguf
from pruning.model.blocks import BlockStack
from pruning.model.checkpoint import PrunedCheckpoint
from pruning.model.sources import resolve_model


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """A fresh DEPTHPRUNE_HOME (conversion cache, registry, variants) per test."""
    directory = tmp_path / "home"
    monkeypatch.setenv("DEPTHPRUNE_HOME", str(directory))
    return directory


@pytest.mark.parametrize("architecture", ["qwen3", "qwen2"])
def test_prune_from_a_gguf_of_another_architecture_checkpoints_exactly(architecture, home, tmp_path, run_cli):
    path = tmp_path / f"tiny-{architecture}.F32.gguf"
    reference = write_tiny_gguf(path, architecture, seed=3)
    arguments = ["--objective", "perplexity", "--data", "pydoc", "--samples", "4", "--seq-len", "24"]
    arguments += ["--drop", "2", "--search", "greedy", "--out", tmp_path / "variants", "--json"]
    code, out, error = run_cli("prune", "--model", path, *arguments)
    assert code == 0, error
    (report,) = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    written = PrunedCheckpoint.read(report["checkpoint"])
    assert written.architecture == architecture and written.base_source.architecture == architecture
    removed, kept = written.removed_blocks, written.kept_to_original
    assert len(removed) == 2 and kept == [i for i in range(6) if i not in removed]

    config = json.loads((Path(written.path) / "config.json").read_text())
    assert config["model_type"] == architecture and config["num_hidden_layers"] == 4
    assert len(config.get("layer_types") or kept) == len(kept)
    source = load_file(Path(resolve_model(str(path)).model) / "model.safetensors")
    variant_tensors = load_file(Path(written.path) / "model.safetensors")
    for name, tensor in variant_tensors.items():  # the variant's block i is the source's block kept[i]
        assert torch.equal(tensor, source[_original_name(name, kept)]), name
    expected_names = {name for name in source if not _in_removed_block(name, removed)}
    renamed = {_original_name(name, kept) for name in variant_tensors}
    assert renamed == expected_names

    variant = AutoModelForCausalLM.from_pretrained(written.path, dtype=torch.float32).eval()
    input_ids = torch.randint(4, 256, (2, 20), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        expected = BlockStack(reference).forward(input_ids, removed)
        torch.testing.assert_close(variant(input_ids).logits, expected, rtol=1e-5, atol=1e-5)


def _in_removed_block(name: str, removed: list[int]) -> bool:
    parts = name.split(".")
    return parts[:2] == ["model", "layers"] and int(parts[2]) in removed


def _original_name(name: str, kept: list[int]) -> str:
    parts = name.split(".")
    if parts[:2] == ["model", "layers"]:
        parts[2] = str(kept[int(parts[2])])
    return ".".join(parts)
