"""A model's shape read from its ``config.json`` alone: what the memory planner needs, no weights, no torch.

:func:`read_model_config` takes a local directory, a ``config.json`` path, a hub id (only ``config.json`` is
fetched, through huggingface_hub's cache, so it works offline once cached) or an already parsed dict;
:func:`model_shape` turns it into a :class:`ModelShape`. Fields a config leaves out get the defaults of its
``model_type`` as transformers would fill them (Gemma-3's public configs omit most of ``text_config``).
Multimodal configs (a ``text_config`` beside a ``vision_config``) plan the language model and count the
vision tower's parameters as extra weights, since AutoModelForCausalLM and vLLM load them too.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ground.core.errors import UserError

# Defaults transformers' config classes fill in when config.json leaves a field out (per model_type).
MODEL_TYPE_DEFAULTS: dict[str, dict] = {
    "gemma3_text": {
        "vocab_size": 262208,
        "hidden_size": 2304,
        "intermediate_size": 9216,
        "num_hidden_layers": 26,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "max_position_embeddings": 131072,
        "sliding_window": 4096,
        "sliding_window_pattern": 6,
        "tie_word_embeddings": True,
    },
    "gemma2": {"head_dim": 256, "tie_word_embeddings": True, "sliding_window": 4096},
    "gemma": {"head_dim": 256, "tie_word_embeddings": True},
    "qwen3": {"tie_word_embeddings": False},
}
# Norms inside one block (input + post-attention; Gemma-2/3 also normalise before and after the MLP).
NORMS_PER_BLOCK = {"gemma2": 4, "gemma3_text": 4, "gemma3": 4}
# Architectures with a norm on queries and keys (one vector of head_dim each).
QK_NORM_TYPES = {"qwen3", "qwen3_moe", "gemma3_text", "gemma3", "olmo2"}
# Architectures whose q, k, v projections carry a bias even when config.json does not say so.
QKV_BIAS_TYPES = {"qwen2", "qwen2_moe"}
SIGLIP_CHANNELS = 3


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a decoder-only language model that decide its memory."""

    model_type: str
    """``model_type`` of the language model (``llama``, ``qwen3``, ``gemma3_text``, ...)."""
    vocab_size: int
    """Rows of the embedding matrix (and of the LM head)."""
    hidden_size: int
    """Width of the residual stream."""
    num_layers: int
    """Transformer blocks."""
    num_heads: int
    """Query heads per block."""
    num_kv_heads: int
    """Key/value heads per block (fewer than query heads under grouped-query attention)."""
    head_dim: int
    """Width of one attention head."""
    intermediate_size: int
    """Width of a dense MLP (gated: gate and up projections of this width, then down)."""
    tie_word_embeddings: bool
    """LM head shares the embedding matrix (counted once)."""
    max_position_embeddings: int
    """The model's native context."""
    layer_types: tuple[str, ...]
    """Per block: ``full_attention`` or ``sliding_attention`` (sliding ones keep ``sliding_window`` keys)."""
    sliding_window: int | None = None
    """Keys a sliding-attention block attends to."""
    gated_mlp: bool = True
    """Gate, up and down projections (SwiGLU/GeGLU) rather than up and down."""
    norms_per_block: int = 2
    """RMSNorm vectors of hidden width per block."""
    qk_norm: bool = False
    """A head_dim-wide norm on queries and keys."""
    qkv_bias: bool = False
    """q, k, v projections carry biases."""
    mlp_bias: bool = False
    """MLP projections carry biases."""
    num_experts: int = 0
    """Routed experts per MoE block (0: dense MLPs everywhere)."""
    experts_per_token: int = 0
    """Experts a token is routed to."""
    expert_intermediate_size: int = 0
    """Width of one expert's MLP."""
    shared_expert_intermediate_size: int = 0
    """Width of the always-on shared expert (Qwen2-MoE), 0 when none."""
    dense_layers: tuple[int, ...] = ()
    """Blocks of an MoE model that keep a dense MLP."""
    extra_parameters: int = 0
    """Parameters outside the language model that are loaded with it (a vision tower and its projector)."""
    torch_dtype: str | None = None
    """The dtype config.json says the weights are stored in."""
    notes: tuple[str, ...] = field(default=())
    """What the reader assumed (unknown architecture treated as Llama-like, ...)."""

    @property
    def kv_dim(self) -> int:
        """Width of one block's keys (and of its values)."""
        return self.num_kv_heads * self.head_dim


def read_model_config(source: str | Path | dict) -> dict:
    """The parsed ``config.json`` of a local directory, a config file, a hub id, or ``source`` itself.

    Only ``config.json`` is read from the hub (through huggingface_hub's cache; offline once cached).

    Raises:
        UserError: nothing readable at ``source``.
    """
    if isinstance(source, dict):
        return source
    path = Path(source).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if path.is_file():
        try:
            return json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as error:
            raise UserError(f"cannot read {path}: {error}") from None
    if path.suffix == ".gguf" or Path(source).exists():
        raise UserError(f"{source} has no config.json to plan from (convert it first, or pass the hub id)")
    return _hub_config(str(source))


def _hub_config(repo_id: str) -> dict:
    """``config.json`` of a hub model, from the local cache when it is there."""
    try:
        from huggingface_hub import hf_hub_download
    except ImportError:  # pragma: no cover - huggingface_hub comes with transformers
        raise UserError(f"{repo_id} is not a local directory and huggingface_hub is not installed") from None
    try:
        return json.loads(Path(hf_hub_download(repo_id, "config.json")).read_text())
    except Exception as error:  # network, gated repo, unknown id: one line for the user
        raise UserError(
            f"cannot read config.json of {repo_id!r} (not a local directory; hub: {type(error).__name__}: "
            f"{str(error).splitlines()[0] if str(error) else ''})"
        ) from None


def _layer_types(config: dict, num_layers: int) -> tuple[str, ...]:
    """Per-block attention kind: the explicit ``layer_types``, else Gemma's pattern, else all full."""
    if config.get("layer_types"):
        return tuple(config["layer_types"])[:num_layers]
    pattern = config.get("sliding_window_pattern")
    if pattern and config.get("sliding_window"):
        return tuple(
            "full_attention" if (index + 1) % pattern == 0 else "sliding_attention"
            for index in range(num_layers)
        )
    if config.get("model_type") == "gemma2" and config.get("sliding_window"):
        return tuple(
            "sliding_attention" if index % 2 == 0 else "full_attention" for index in range(num_layers)
        )
    return ("full_attention",) * num_layers


def _vision_parameters(vision: dict, text_hidden: int) -> int:
    """Parameters of a SigLIP vision tower and Gemma-3's projector into the text width."""
    hidden = int(vision.get("hidden_size", 1152))
    intermediate = int(vision.get("intermediate_size", 4304))
    patch = int(vision.get("patch_size", 14))
    image = int(vision.get("image_size", 896))
    layers = int(vision.get("num_hidden_layers", 27))
    embeddings = SIGLIP_CHANNELS * patch * patch * hidden + hidden + (image // patch) ** 2 * hidden
    # q, k, v, o with biases; two layer norms (weight and bias); fc1 and fc2 with biases
    per_layer = (
        4 * (hidden * hidden + hidden) + 2 * 2 * hidden + 2 * hidden * intermediate + intermediate + hidden
    )
    projector = hidden * text_hidden + hidden  # mm_input_projection_weight and mm_soft_emb_norm
    return embeddings + layers * per_layer + 2 * hidden + projector


def model_shape(config: dict) -> ModelShape:
    """The :class:`ModelShape` of a parsed ``config.json`` (defaults of its ``model_type`` filled in).

    Raises:
        UserError: the config lacks the sizes of a decoder-only Transformer.
    """
    extra, notes = 0, []
    if isinstance(config.get("text_config"), dict):
        text = dict(config["text_config"])
        text.setdefault("model_type", f"{config.get('model_type', '')}_text")
        if isinstance(config.get("vision_config"), dict):
            extra = _vision_parameters(config["vision_config"], int(text.get("hidden_size", 0) or 0))
            notes.append("vision tower and projector counted as extra weights")
        text.setdefault("torch_dtype", config.get("torch_dtype"))
        config = text
    model_type = str(config.get("model_type", ""))
    config = {**MODEL_TYPE_DEFAULTS.get(model_type, {}), **{k: v for k, v in config.items() if v is not None}}
    missing = [
        key
        for key in (
            "vocab_size",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
        )
        if key not in config and not (key == "intermediate_size" and "moe_intermediate_size" in config)
    ]
    if missing:
        raise UserError(f"config.json lacks {', '.join(missing)}: not a decoder-only model the planner knows")
    hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
    layers = int(config["num_hidden_layers"])
    if model_type and model_type not in _KNOWN_TYPES:
        notes.append(f"model_type {model_type!r} planned as a Llama-like decoder")
    experts = int(config.get("num_local_experts") or config.get("num_experts") or 0)
    step = int(config.get("decoder_sparse_step") or 1)
    dense_layers = tuple(
        index
        for index in range(layers)
        if experts and (index in (config.get("mlp_only_layers") or []) or (index + 1) % step != 0)
    )
    return ModelShape(
        model_type=model_type,
        vocab_size=int(config["vocab_size"]),
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=int(config.get("num_key_value_heads") or heads),
        head_dim=int(config.get("head_dim") or hidden // heads),
        intermediate_size=int(config.get("intermediate_size") or 0),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        max_position_embeddings=int(config.get("max_position_embeddings") or 2048),
        layer_types=_layer_types({**config, "model_type": model_type}, layers),
        sliding_window=config.get("sliding_window") if config.get("use_sliding_window", True) else None,
        gated_mlp=model_type not in {"gpt2", "gpt_neox", "opt", "phi"},
        norms_per_block=NORMS_PER_BLOCK.get(model_type, 2),
        qk_norm=model_type in QK_NORM_TYPES,
        qkv_bias=bool(config.get("attention_bias", False)) or model_type in QKV_BIAS_TYPES,
        mlp_bias=bool(config.get("mlp_bias", False)),
        num_experts=experts,
        experts_per_token=int(config.get("num_experts_per_tok") or 0),
        expert_intermediate_size=int(
            config.get("moe_intermediate_size") or config.get("intermediate_size") or 0
        ),
        shared_expert_intermediate_size=int(config.get("shared_expert_intermediate_size") or 0),
        dense_layers=dense_layers,
        extra_parameters=extra,
        torch_dtype=config.get("torch_dtype") or config.get("dtype"),
        notes=tuple(notes),
    )


_KNOWN_TYPES = {
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "gemma",
    "gemma2",
    "gemma3_text",
    "phi3",
    "mixtral",
    "qwen2_moe",
    "qwen3_moe",
    "olmo2",
    "granite",
    "smollm3",
}
