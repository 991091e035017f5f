"""Tiny random models of every supported architecture, built in memory or saved to a directory.

head_dim is 32 because the vLLM CPU engine (0.32) dies without a message at the first generation step
on smaller heads.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["TINY_COMMON", "save_tiny_model", "tiny_config", "tiny_model", "tiny_tokenizer"]

TINY_COMMON = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=6,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=32,
    max_position_embeddings=256,
)


def tiny_config(architecture: str):
    """A 6-block config of ``architecture`` (llama, qwen2, qwen3, mistral, gemma3_text)."""
    from transformers import Gemma3TextConfig, LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    if architecture == "llama":
        return LlamaConfig(**TINY_COMMON)
    if architecture == "qwen2":
        return Qwen2Config(**TINY_COMMON)
    if architecture == "qwen3":
        return Qwen3Config(**TINY_COMMON, tie_word_embeddings=True)
    if architecture == "mistral":
        return MistralConfig(**TINY_COMMON, sliding_window=8)
    if architecture == "gemma3_text":
        return Gemma3TextConfig(
            **TINY_COMMON,
            sliding_window=8,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"] * 2,
        )
    raise ValueError(architecture)


def tiny_model(architecture: str, seed: int = 0):
    """A random causal LM of ``architecture`` in float32 eval mode."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(tiny_config(architecture), dtype=torch.float32).eval()


def save_tiny_model(architecture: str, directory: Path, seed: int = 0) -> Path:
    """Save a random tiny model with a small word-level tokenizer, loadable by transformers and vLLM."""
    model = tiny_model(architecture, seed)
    model.save_pretrained(directory)
    tiny_tokenizer().save_pretrained(directory)
    return directory


def tiny_tokenizer():
    """A byte-free word-level tokenizer over 256 ids, enough for prompts made of its own words."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "<pad>": 3}
    for i in range(4, 256):
        vocab[f"w{i}"] = i
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )
