"""Exact parameter counts of a :class:`~ground.planning.shape.ModelShape`, per part and per block.

The count is what ``sum(p.numel() for p in model.parameters())`` gives for the architectures the shape
reader knows (tied embeddings counted once); the tests hold it against published totals.
"""

from __future__ import annotations

from dataclasses import dataclass

from ground.planning.shape import ModelShape


@dataclass(frozen=True)
class ParameterCount:
    """Parameters of a model split by where they sit (device placement splits along these lines)."""

    embedding: int
    """Input embedding matrix."""
    head: int
    """LM head and final norm (the head is 0 extra when tied to the embedding)."""
    blocks: tuple[int, ...]
    """Each Transformer block."""
    extra: int
    """Loaded beside the language model (vision tower, projector)."""
    tied: bool = False
    """The LM head shares the embedding's weight (placement keeps them on one card)."""

    @property
    def total(self) -> int:
        """Every parameter, once."""
        return self.embedding + self.head + sum(self.blocks) + self.extra


def _mlp_parameters(hidden: int, intermediate: int, gated: bool, bias: bool) -> int:
    """One MLP: (gate,) up and down projections."""
    matrices = 3 if gated else 2
    biases = ((2 if gated else 1) * intermediate + hidden) if bias else 0
    return matrices * hidden * intermediate + biases


def block_parameters(shape: ModelShape, index: int) -> int:
    """Parameters of block ``index``: attention (GQA), MLP or routed experts, norms."""
    hidden, q_dim, kv_dim = shape.hidden_size, shape.num_heads * shape.head_dim, shape.kv_dim
    attention = hidden * q_dim + 2 * hidden * kv_dim + q_dim * hidden
    if shape.qkv_bias:
        attention += q_dim + 2 * kv_dim
    if shape.qk_norm:
        attention += 2 * shape.head_dim
    if shape.num_experts and index not in shape.dense_layers:
        expert = _mlp_parameters(hidden, shape.expert_intermediate_size, shape.gated_mlp, shape.mlp_bias)
        mlp = shape.num_experts * expert + hidden * shape.num_experts  # experts and the router
        if shape.shared_expert_intermediate_size:
            mlp += _mlp_parameters(hidden, shape.shared_expert_intermediate_size, True, False) + hidden
    else:
        mlp = _mlp_parameters(hidden, shape.intermediate_size, shape.gated_mlp, shape.mlp_bias)
    return attention + mlp + shape.norms_per_block * hidden


def active_block_parameters(shape: ModelShape, index: int) -> int:
    """Parameters a token runs through in block ``index`` (routed experts: only its top-k)."""
    if not shape.num_experts or index in shape.dense_layers:
        return block_parameters(shape, index)
    idle = shape.num_experts - max(shape.experts_per_token, 1)
    return block_parameters(shape, index) - idle * _mlp_parameters(
        shape.hidden_size, shape.expert_intermediate_size, shape.gated_mlp, shape.mlp_bias
    )


def count_parameters(shape: ModelShape) -> ParameterCount:
    """Every parameter of the model, split into embedding, blocks, head and extra weights."""
    embedding = shape.vocab_size * shape.hidden_size
    head = shape.hidden_size + (0 if shape.tie_word_embeddings else embedding)
    blocks = tuple(block_parameters(shape, index) for index in range(shape.num_layers))
    return ParameterCount(embedding, head, blocks, shape.extra_parameters, shape.tie_word_embeddings)


def lora_parameters(shape: ModelShape, rank: int, targets: tuple[str, ...]) -> int:
    """Trainable parameters of LoRA adapters of ``rank`` on the named projections of every block."""
    hidden, q_dim, kv_dim = shape.hidden_size, shape.num_heads * shape.head_dim, shape.kv_dim
    widths = {
        "q_proj": (hidden, q_dim),
        "k_proj": (hidden, kv_dim),
        "v_proj": (hidden, kv_dim),
        "o_proj": (q_dim, hidden),
        "gate_proj": (hidden, shape.intermediate_size),
        "up_proj": (hidden, shape.intermediate_size),
        "down_proj": (shape.intermediate_size, hidden),
    }
    per_block = sum(rank * sum(widths[name]) for name in targets if name in widths)
    return per_block * shape.num_layers
