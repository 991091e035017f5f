"""Parity on the real model: SmolLM2-135M-Instruct (the embedded ``smollm2-135m`` GGUF), pruned and reloaded.

For several non-contiguous removal sets, the written checkpoint's transformers logits equal the dense
model run with those blocks skipped (float32), and vLLM's greedy tokens on it equal transformers'. The GGUF
is converted once per session (about a minute on 2 cores) into the session's ``DEPTHPRUNE_HOME``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from depthprune.testing.generation import transformers_greedy, vllm_greedy
from pruning.model.blocks import BlockStack, load_model
from pruning.model.checkpoint import PrunedCheckpoint, write_pruned_checkpoint
from pruning.model.sources import resolve_model

pytestmark = pytest.mark.slow

# 30 blocks; every set has gaps, and the first and last blocks each appear in one.
REMOVAL_SETS = [
    [0, 7, 19],
    [3, 4, 5, 12, 13, 14, 25, 26],
    [1, 9, 17, 29],
    [2, 6, 11, 15, 20, 24, 27],
]
TEXTS = [
    "The capital of France is Paris. The capital of Germany is Berlin. The capital of Italy is",
    "A list is a mutable sequence type in Python: items can be appended, removed or sorted in place,",
    "Photosynthesis is the process by which green plants use sunlight to make food from carbon dioxide",
]
# Largest |logit difference| allowed between the pruned checkpoint and the dense model with blocks skipped.
LOGIT_TOLERANCE = 1e-4


@pytest.fixture(scope="session")
def real_model():
    """``(resolved model, dense BlockStack, tokenizer)`` of smollm2-135m, converted once per session."""
    resolved = resolve_model("smollm2-135m")
    model, tokenizer = load_model("smollm2-135m", dtype="float32")
    return resolved, BlockStack(model), tokenizer


@pytest.fixture(scope="session")
def pruned_variants(real_model, tmp_path_factory):
    """``removed set (tuple) -> checkpoint directory`` for every set of :data:`REMOVAL_SETS`."""
    root = tmp_path_factory.mktemp("real-variants")
    return {
        tuple(removed): Path(write_pruned_checkpoint("smollm2-135m", removed, root / f"m{index}").path)
        for index, removed in enumerate(REMOVAL_SETS)
    }


def prompt_batch(tokenizer) -> torch.Tensor:
    """The texts as one ``[3, length]`` batch, cut to the shortest so no padding is needed."""
    encoded = [tokenizer(text).input_ids for text in TEXTS]
    length = min(len(ids) for ids in encoded)
    return torch.tensor([ids[:length] for ids in encoded])


def test_real_model_is_what_the_issue_says(real_model, pruned_variants):
    resolved, dense, tokenizer = real_model
    config = dense.config
    assert (config.model_type, config.num_hidden_layers, config.hidden_size) == ("llama", 30, 576)
    assert config.tie_word_embeddings and config.vocab_size == 49152
    assert resolved.source.architecture == "llama" and resolved.source.embedded_name == "smollm2-135m"
    assert tokenizer.chat_template and (Path(resolved.model) / "generation_config.json").is_file()
    # A real language model: it completes a pattern no random model would.
    input_ids = torch.tensor([tokenizer(TEXTS[0]).input_ids])
    continuation = dense.model.generate(input_ids, max_new_tokens=3, do_sample=False)[0, input_ids.shape[1] :]
    assert tokenizer.decode(continuation).strip().startswith("Rome")
    # Every variant's pruning.json names the GGUF it came from.
    for directory in pruned_variants.values():
        written = PrunedCheckpoint.read(directory)
        assert written.base_model == resolved.model and written.base_source == resolved.source


@pytest.mark.parametrize("removed", REMOVAL_SETS, ids=lambda removed: "-".join(map(str, removed)))
def test_pruned_checkpoint_logits_equal_dense_with_blocks_skipped(real_model, pruned_variants, removed):
    _, dense, tokenizer = real_model
    variant = AutoModelForCausalLM.from_pretrained(
        pruned_variants[tuple(removed)], dtype=torch.float32
    ).eval()
    assert variant.config.num_hidden_layers == 30 - len(removed)
    input_ids = prompt_batch(tokenizer)
    with torch.no_grad():
        expected = dense.forward(input_ids, removed)
        actual = variant(input_ids, use_cache=False).logits
    difference = float((actual - expected).abs().max())
    print(f"removed {removed}: max |Δlogit| = {difference:.3g} over {tuple(actual.shape)}")
    assert difference <= LOGIT_TOLERANCE


@pytest.mark.vllm
def test_vllm_greedy_tokens_equal_transformers_on_pruned_real_model(real_model, pruned_variants, tmp_path):
    _, _, tokenizer = real_model
    chosen = [pruned_variants[tuple(REMOVAL_SETS[0])], pruned_variants[tuple(REMOVAL_SETS[1])]]
    prompts = [tokenizer(text).input_ids for text in TEXTS]
    max_tokens = 16
    # vLLM's CPU engine sizes its KV cache as a fraction of host memory minus what the process holds;
    # with a 0.5 GB model that fraction leaves nothing, so give it 1 GiB explicitly (ignored on GPUs).
    generated = vllm_greedy(chosen, prompts, max_tokens, tmp_path, 1200, env={"VLLM_CPU_KVCACHE_SPACE": "1"})
    for directory in chosen:
        model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
        for prompt, vllm_tokens in zip(prompts, generated[str(directory)]):
            expected, gaps = transformers_greedy(model, prompt, max_tokens)
            steps = zip(vllm_tokens, expected)
            differs = next((step for step, (ours, theirs) in enumerate(steps) if ours != theirs), None)
            print(f"{directory.name}: vLLM {vllm_tokens} transformers {expected} first difference {differs}")
            if differs is not None:
                # Only a near-tie (float noise between two kernels) may flip a token; after it texts differ.
                assert gaps[differs] < 1e-3, (directory.name, prompt, differs, vllm_tokens, expected)
            else:
                assert len(vllm_tokens) == max_tokens
