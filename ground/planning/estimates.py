"""Byte estimates of what one step of a run holds at its peak, from a model's shape and the run's sizes.

Each function answers one question (the weights on the fullest device, a forward's activations, the
boundary cache, the KL reference, CBO's backward, healing's optimizer states, one vLLM engine's KV cache)
and is deliberately simple: the planner's job is to tell 16 GiB from 60 GiB before a weight is loaded, not
to predict the allocator to the megabyte. Attention is assumed to run a fused kernel (SDPA/flash on CUDA),
so no ``seq_len ** 2`` scores are counted.
"""

from __future__ import annotations

from ground.planning.parameters import ParameterCount, active_block_parameters, count_parameters
from ground.planning.placement import place_blocks
from ground.planning.shape import ModelShape

FP32 = 4
LOGIT_BYTES_PER_POSITION_EXTRA = FP32 + FP32
"""Per position and vocabulary entry beyond the head's own output: the fp32 upcast and its log-softmax."""
BASE_WIDTH = {"greedy": 1, "beam": 5}
"""Bases a search extends at once (beam: its default width, pruning.search.beam.Options.width). The evaluator
keeps each base's states at the boundaries along its path and drops those of bases the search has left."""
SET_SCORING = frozenset({"genetic", "bayesian", "cbo", "fast_block_select", "evolution"})
"""Searches that score removal sets anywhere in the space: the evaluator keeps their paths' states until its
cache budget is full (least recently used out first)."""
ADAM_STATES = 2
"""AdamW keeps two moments per trainable parameter."""
VLLM_ACTIVATION_TOKENS = 8192
"""Tokens vLLM's profile run pushes through the model at once (its default ``max_num_batched_tokens``)."""
VLLM_OVERHEAD_BYTES = 2 * 1024**3
"""Non-torch memory of a vLLM engine (NCCL, CUDA graphs, sampler) beyond its profiled peak."""
HEAD_CHUNK_POSITIONS = 512
"""Positions whose logits healing materialises at once (pruning.healing.losses.CHUNK_POSITIONS)."""
CALIBRATION_HEAD_CHUNK = 4096
"""Positions whose logits a calibration loss materialises at once
(pruning.calibration.objectives.batches.HEAD_CHUNK_POSITIONS)."""
EVALUATION_HEAD_CHUNK = 1024
"""Positions whose logits the torch evaluation engine materialises at once
(pruning.evaluation.packed_scoring.HEAD_CHUNK_POSITIONS)."""


def weights_on_fullest_device(count: ParameterCount, dtype_bytes: int, devices: int) -> int:
    """Bytes of weights on the most loaded of ``devices`` cards, placed as loading places them.

    The placement is :func:`~ground.planning.placement.place_blocks` (the device_map ``--gpus N`` loads):
    the embedding on the first card, the head on the last, blocks balanced between them.
    """
    if devices <= 1:
        return count.total * dtype_bytes
    return max(place_blocks(count, devices, count.tied).device_parameters) * dtype_bytes


def block_activation_bytes(shape: ModelShape, tokens: int, dtype_bytes: int) -> int:
    """Peak of one block's forward over ``tokens`` positions (inference: nothing kept for backward)."""
    q_dim = shape.num_heads * shape.head_dim
    mlp = shape.intermediate_size
    if shape.num_experts:
        mlp = max(mlp, shape.expert_intermediate_size * max(shape.experts_per_token, 1))
    # residual in and out, normed input, attention output; q, k, v; gate, up and their product
    per_token = 4 * shape.hidden_size + q_dim + 2 * shape.kv_dim + 3 * mlp
    return tokens * per_token * dtype_bytes


def logits_bytes(shape: ModelShape, positions: int, dtype_bytes: int) -> int:
    """The LM head's output over ``positions`` plus its fp32 log-softmax (what a loss materialises)."""
    return positions * shape.vocab_size * (dtype_bytes + LOGIT_BYTES_PER_POSITION_EXTRA)


def forward_activation_bytes(
    shape: ModelShape, sequences: int, seq_len: int, dtype_bytes: int, head_chunk: int | None = None
) -> int:
    """Peak of an inference forward of ``sequences`` x ``seq_len`` tokens, loss included.

    Args:
        head_chunk: positions of one sequence whose logits exist at once (the loss runs the head sequence by
            sequence, in chunks: perplexity and KL; the task objectives only on a few answer positions);
            None: every position of every sequence at once.
    """
    tokens = sequences * seq_len
    head_positions = tokens if head_chunk is None else min(seq_len, head_chunk)
    return max(
        block_activation_bytes(shape, tokens, dtype_bytes), logits_bytes(shape, head_positions, dtype_bytes)
    )


def backward_activation_bytes(
    shape: ModelShape, sequences: int, seq_len: int, dtype_bytes: int, head_chunk: int | None = None
) -> int:
    """Activations a backward through every block keeps (CBO's gradients, healing), plus the head's.

    Args:
        head_chunk: positions whose logits exist at once (healing chunks its loss); None: all of them.
    """
    tokens = sequences * seq_len
    q_dim = shape.num_heads * shape.head_dim
    # saved per block and token: norm inputs and outputs, q, k, v, attention output, MLP gate/up/act
    per_token_block = 6 * shape.hidden_size + q_dim + 2 * shape.kv_dim + 3 * shape.intermediate_size
    blocks = tokens * per_token_block * dtype_bytes * shape.num_layers
    head_positions = tokens if head_chunk is None else min(tokens, head_chunk)
    return blocks + 2 * logits_bytes(shape, head_positions, dtype_bytes)  # the logits and their gradient


def boundary_bytes(shape: ModelShape, samples: int, seq_len: int, dtype_bytes: int) -> int:
    """One block boundary (the hidden states entering a block) over every calibration token."""
    return samples * seq_len * shape.hidden_size * dtype_bytes


def trie_path_bytes(shape: ModelShape, batch: int, seq_len: int, dtype_bytes: int, cards: int = 1) -> int:
    """The states a group of sets keeps while it walks the trie of removal sets: at most one per block on the
    current set's path, each one calibration batch wide; on each of ``cards`` a share, since each state lives
    on its block's card when the blocks are spread."""
    return -(-shape.num_layers * batch * seq_len * shape.hidden_size * dtype_bytes // cards)


def search_state_paths(searches: tuple[str, ...], shared: bool) -> int | None:
    """Removal paths whose boundary states the evaluator may hold beyond the dense cache at once (each at most
    N - 1 boundaries): a base-extending search's bases, and the path of each search's final set (scored once
    at its end); None when a search scores sets anywhere (the cache budget then fills).

    Args:
        shared: every search on one evaluator (``--timing shared``: final paths add up), else one each.
    """
    if any(name in SET_SCORING for name in searches):
        return None
    widths = [BASE_WIDTH.get(name, 0) for name in searches]
    if shared:
        return max(widths, default=0) + len(searches)
    return max((max(width, 1) for width in widths), default=0)


def kl_reference_logprob_bytes(shape: ModelShape, samples: int, seq_len: int) -> int:
    """The dense model's fp32 log-probabilities over every calibration position (KL objective)."""
    return samples * seq_len * shape.vocab_size * FP32


def optimizer_bytes(trainable: int, dtype_bytes: int) -> int:
    """Trainable weights' gradients and AdamW's two moments (kept in the parameters' dtype)."""
    return trainable * dtype_bytes * (1 + ADAM_STATES)


def kv_cache_bytes(shape: ModelShape, tokens: int, dtype_bytes: int) -> int:
    """Keys and values of ``tokens`` positions of one sequence in every block (sliding blocks: the window)."""
    total = 0
    for kind in shape.layer_types:
        kept = (
            min(tokens, shape.sliding_window)
            if kind == "sliding_attention" and shape.sliding_window
            else tokens
        )
        total += 2 * kept * shape.kv_dim * dtype_bytes
    return total


def engine_activation_bytes(shape: ModelShape, dtype_bytes: int, prompt_logprobs_len: int = 0) -> int:
    """vLLM's profiled peak: one batch of its token budget, plus full-vocabulary prompt log-probs if asked."""
    tokens = VLLM_ACTIVATION_TOKENS
    peak = block_activation_bytes(shape, tokens, dtype_bytes)
    if prompt_logprobs_len:
        peak = max(peak, logits_bytes(shape, prompt_logprobs_len, dtype_bytes))
    return peak + VLLM_OVERHEAD_BYTES


def active_parameters(shape: ModelShape) -> int:
    """Parameters a token runs through (equals the total for dense models)."""
    count = count_parameters(shape)
    blocks = sum(active_block_parameters(shape, index) for index in range(shape.num_layers))
    return count.embedding + count.head + blocks
