"""GGUF files written by the ``gguf`` package from tiny random models: project-made data, nothing downloaded.

:func:`write_tiny_gguf` stores any tiny model of :func:`depthprune.testing.models.tiny_model` as an F32 GGUF
with a small byte-level BPE vocabulary. Tensor names come from the ``gguf`` package's own name map for the
architecture (the one llama.cpp's converter uses), so no architecture needs a table of its own; the one
rewrite is llama.cpp's Q/K row order for Llama and Mistral, which transformers undoes when it loads them.
"""

from __future__ import annotations

from pathlib import Path

CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"
"""The chat template stored in every file (checked after conversion)."""
PERMUTED_QK = {"llama", "mistral"}
"""GGUF architectures whose Q/K rows llama.cpp interleaves (transformers' loader permutes them back)."""


def llama_cpp_permute(weight, heads: int):
    """llama.cpp's Q/K row order (rotary halves interleaved); transformers undoes it when loading."""
    return (
        weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def _add_metadata(writer, config) -> None:
    """Hyper-parameters under llama.cpp's key names (transformers maps them back to the config)."""
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_key_length(config.head_dim)
    writer.add_value_length(config.head_dim)
    writer.add_rope_dimension_count(config.head_dim)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)


def _add_vocabulary(writer, vocab_size: int) -> None:
    """A byte-level BPE vocabulary of ``vocab_size`` tokens with one merge and the usual specials."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    specials = ["<unk>", "<s>", "</s>", "<pad>"]
    tokens = specials + list(bytes_to_unicode().values())[: vocab_size - len(specials) - 1] + ["he"]
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([3] * len(specials) + [1] * (len(tokens) - len(specials)))
    writer.add_token_merges(["h e"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_pad_token_id(3)
    writer.add_chat_template(CHAT_TEMPLATE)


def write_model_gguf(model, path: Path, architecture: str, name: str) -> Path:
    """Write a transformers causal LM as an F32 GGUF of ``architecture`` (llama.cpp's name).

    Args:
        model: the model (its ``state_dict`` is written; a tied head is left out, as llama.cpp does).
        path: the file to write.
        architecture: ``general.architecture``, e.g. ``llama`` or ``qwen3``.
        name: ``general.name``.
    """
    import gguf

    config = model.config
    arch = {value: key for key, value in gguf.MODEL_ARCH_NAMES.items()}[architecture]
    names = gguf.get_tensor_name_map(arch, config.num_hidden_layers)
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_name(name)
    _add_metadata(writer, config)
    _add_vocabulary(writer, config.vocab_size)
    for key, tensor in model.state_dict().items():
        if key == "lm_head.weight" and config.tie_word_embeddings:
            continue
        module, suffix = key.rsplit(".", 1)
        gguf_name = names.get_name(module)
        if gguf_name is None:
            raise ValueError(f"no GGUF name for {key} in architecture {architecture}")
        if architecture in PERMUTED_QK and gguf_name.endswith(("attn_q", "attn_k")):
            heads = config.num_attention_heads if gguf_name.endswith("attn_q") else config.num_key_value_heads
            tensor = llama_cpp_permute(tensor, heads)
        writer.add_tensor(f"{gguf_name}.{suffix}", tensor.detach().float().numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_tiny_gguf(path: Path, architecture: str = "llama", seed: int = 0):
    """Write a tiny random model of ``architecture`` (``llama``, ``qwen2``, ``qwen3``) as an F32 GGUF.

    Returns:
        The torch model the file holds (to compare logits with).
    """
    from depthprune.testing.models import tiny_model

    model = tiny_model(architecture, seed)
    write_model_gguf(model, path, architecture, f"tiny {architecture}")
    return model
