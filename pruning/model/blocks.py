"""Block access for every supported decoder architecture, and forwards with any set of blocks skipped.

The searches and objectives never reach into a model; they go through :class:`BlockStack`, which knows
where a causal LM keeps its embeddings, decoder blocks, final norm, rotary embedding and LM head.

How a block is called differs across architectures (Gemma-3 gives sliding-window layers their own mask
and rotary table, Mistral masks by window, Qwen3 may mix both). Rather than re-deriving those arguments
per architecture, :meth:`BlockStack.prepare` runs the model's own forward once with every block swapped
for a recorder that returns its input unchanged: that costs an embedding lookup, and yields exactly
the keyword arguments the model itself passes to block ``i``. Running any subset of blocks is then
a loop over the real blocks with those arguments. No forward is patched; the module list is restored
before ``prepare`` returns.

Several sequences that share a prefix (a question and its answer choices) can run as one packed sequence
``[prefix][branch 1][branch 2]...``: :meth:`BlockStack.segment_attention_mask` builds the 4-D mask (each
branch sees the prefix and itself, causally, never another branch; sliding-window layers get the window
applied to the restarted positions), which ``prepare`` passes with the ``position_ids`` to the model's own
forward. The masking utilities of transformers return a ready 4-D mask as it is, and the models that mix
full and sliding-window layers (Qwen2/3, Gemma-3) accept a ``{layer type: mask}`` dict, so every block then
computes exactly what it computes on each branch run alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ground.core.errors import UserError
from pruning.model.architectures import check_supported
from pruning.model.sources import ResolvedModel, resolve_model


def resolve(model: str, revision: str | None = None) -> ResolvedModel:
    """Resolve a model spec (:func:`pruning.model.sources.resolve_model`); a revision fits hub ids only."""
    resolved = resolve_model(model)
    if resolved.source is not None and revision is not None:
        raise UserError(f"--revision names a hub revision; {model!r} is a GGUF file: leave --revision out")
    return resolved


def load_config(model: str, revision: str | None = None):
    """The transformers config of a model spec, or a one-line :class:`UserError`.

    Args:
        model: hub id, local directory, ``PATH.gguf`` or an embedded model name such as ``smollm2-135m``
            (a GGUF is converted once and cached; see :mod:`pruning.model.sources`).
        revision: hub revision (branch, tag or commit).
    """
    from transformers import AutoConfig

    resolved = resolve(model, revision)
    try:
        config = AutoConfig.from_pretrained(resolved.model, revision=revision)
    except (OSError, ValueError) as error:
        raise UserError(
            f"{model!r} is not a model directory or a hub id that can be loaded: {str(error).splitlines()[0]}"
        ) from None
    check_supported(config)
    return config


def load_model(
    model: str,
    *,
    dtype: str = "float32",
    device: str = "cpu",
    revision: str | None = None,
    gpus: int = 1,
    device_map: dict[str, str] | None = None,
):
    """Load a supported causal LM and its tokenizer in eval mode.

    Args:
        model: hub id, local directory, ``PATH.gguf`` or an embedded model name such as ``smollm2-135m``.
        dtype: torch dtype name (``float32``, ``bfloat16``, ``float16``).
        device: torch device (with ``gpus`` above 1: the first of the cards).
        revision: hub revision (branch, tag or commit).
        gpus: cards to spread the model over (``device`` and the ones after it), placed by the memory
            planner (:func:`pruning.model.placement.device_map`).
        device_map: an explicit ``{module name: device}`` placement instead (overrides ``gpus``).

    Returns:
        ``(model, tokenizer)``.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config = load_config(model, revision)
    path = resolve(model, revision).model
    torch_dtype = getattr(torch, dtype, None)
    if not isinstance(torch_dtype, torch.dtype):
        raise UserError(f"unknown dtype {dtype!r}; use float32, bfloat16 or float16")
    if device_map is None and gpus > 1:
        from pruning.model.placement import device_map as planned_map
        from pruning.model.placement import spread_devices

        device_map = planned_map(config, spread_devices(device, gpus))
    if device_map is None:
        causal_lm = AutoModelForCausalLM.from_pretrained(path, revision=revision, dtype=torch_dtype)
        causal_lm.to(device)
    else:  # accelerate loads each weight straight onto its card and hooks the blocks
        causal_lm = AutoModelForCausalLM.from_pretrained(
            path, revision=revision, dtype=torch_dtype, device_map=device_map
        )
    causal_lm.eval()
    tokenizer = AutoTokenizer.from_pretrained(path, revision=revision)
    return causal_lm, tokenizer


@dataclass
class PreparedBatch:
    """What every block needs for one batch: the embedded input and the per-block call arguments."""

    hidden: torch.Tensor
    """Output of the embedding layer (scaled where the architecture scales it), ``[batch, seq, hidden]``."""
    block_kwargs: list[dict[str, Any]] = field(repr=False)
    """Keyword arguments the model passes to block ``i`` (mask, rotary table, positions)."""


class _Recorder(nn.Module):
    """Stands in for a decoder block in :meth:`BlockStack.prepare`: records its call, returns the input."""

    def __init__(self, index: int, sink: list[dict[str, Any] | None]):
        super().__init__()
        self.index = index
        self.sink = sink

    def forward(self, hidden_states, *args, **kwargs):
        if args:  # every supported architecture passes block arguments by keyword
            raise RuntimeError("decoder block called with positional arguments: unsupported transformers")
        kwargs.pop("past_key_values", None)
        kwargs["use_cache"] = False
        self.sink[self.index] = kwargs
        if self.index == 0:
            self.sink.append({"hidden": hidden_states})
        return hidden_states


class BlockStack:
    """A supported causal LM seen as embeddings → N decoder blocks → final norm → LM head.

    Args:
        model: a loaded ``*ForCausalLM`` of a supported architecture.
    """

    def __init__(self, model):
        check_supported(model.config)
        self.model = model
        self.config = model.config
        self.decoder = model.model
        self.blocks = model.model.layers
        self.embed_tokens = model.model.embed_tokens
        self.norm = model.model.norm
        self.rotary_emb = getattr(model.model, "rotary_emb", None)
        self.lm_head = model.lm_head
        self.final_logit_softcapping = getattr(self.config, "final_logit_softcapping", None)
        # A model loaded with a device_map spreads its blocks over several cards: each block's inputs
        # must be on its card (prepare places the recorded arguments there, to_block_device the states).
        self.block_devices = [module_device(block) for block in self.blocks]
        self.input_device = module_device(self.embed_tokens)
        self.spread = len({*self.block_devices, self.input_device, self.device}) > 1

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def device(self):
        """Where the logits come out (the LM head's card); calibration batches live here."""
        return module_device(self.lm_head)

    def to_block_device(self, index: int, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden`` on block ``index``'s card (itself unless the model is spread over several)."""
        return hidden.to(self.block_devices[index]) if self.spread else hidden

    def validate_removed(self, removed_blocks) -> frozenset[int]:
        """Check a removal set against this model; return it as a frozenset."""
        return validate_removed(removed_blocks, self.num_blocks)

    def prepare(
        self, input_ids: torch.Tensor, attention_mask=None, position_ids: torch.Tensor | None = None
    ) -> PreparedBatch:
        """Embed ``input_ids`` and record the arguments each block receives in the model's own forward.

        Args:
            input_ids: ``[batch, seq]`` token ids.
            attention_mask: ``None`` (causal), a ``[batch, seq]`` padding mask, or what
                :meth:`segment_attention_mask` returns (a ready 4-D mask, or a dict of them by layer type).
            position_ids: ``[batch, seq]`` positions (rotary embeddings); default ``0..seq-1``.
        """
        sink: list[dict[str, Any] | None] = [None] * self.num_blocks
        recorders = [_Recorder(i, sink) for i in range(self.num_blocks)]
        original = self.decoder.layers
        self.decoder.layers = nn.ModuleList(recorders)
        try:
            if isinstance(attention_mask, dict):
                mask = {kind: value.to(self.input_device) for kind, value in attention_mask.items()}
            else:
                mask = None if attention_mask is None else attention_mask.to(self.input_device)
            positions = None if position_ids is None else position_ids.to(self.input_device)
            with torch.no_grad():
                self.decoder(
                    input_ids=input_ids.to(self.input_device),
                    attention_mask=mask,
                    position_ids=positions,
                    use_cache=False,
                )
        finally:
            self.decoder.layers = original
        hidden = sink.pop()["hidden"]
        if self.spread:  # one copy of the mask and rotary tables per card, not per block
            copies: dict[torch.device, dict[int, Any]] = {}
            sink = [
                {
                    name: _on_device(value, device, copies.setdefault(device, {}))
                    for name, value in kwargs.items()
                }
                for kwargs, device in zip(sink, self.block_devices, strict=True)
            ]
        return PreparedBatch(hidden=hidden, block_kwargs=sink)

    @property
    def layer_types(self) -> list[str]:
        """``full_attention`` or ``sliding_attention`` per block, as the model's own forward masks it."""
        types = getattr(self.config, "layer_types", None)
        if types:
            return list(types)
        # Mistral has no layer_types: a configured window applies to every layer.
        kind = "sliding_attention" if getattr(self.config, "sliding_window", None) else "full_attention"
        return [kind] * self.num_blocks

    @property
    def supports_segment_masks(self) -> bool:
        """Whether the attention implementation takes the dense 4-D masks of :meth:`segment_attention_mask`.

        SDPA and eager do; flash-attention kernels take no arbitrary mask (and flex attention wants a
        BlockMask), so callers run such models on unpacked sequences.
        """
        return self.config._attn_implementation in ("sdpa", "eager")

    def segment_attention_mask(self, segments: torch.Tensor, position_ids: torch.Tensor):
        """The attention mask of packed sequences whose branches share a prefix, for :meth:`prepare`.

        A token may attend to a key when the key is in the shared prefix or in the token's own branch, and
        the key's position is not after the token's (positions restart at the prefix length in every
        branch, so a branch computes exactly what it computes run alone after the prefix). Sliding-window
        layers also require ``position − key position < window``, as transformers' own sliding mask does.
        Padding tokens attend to themselves only (a row that attends to nothing would give NaN).

        Args:
            segments: ``[batch, seq]`` 0 for the shared prefix, ``k >= 1`` for branch k, -1 for padding.
            position_ids: ``[batch, seq]`` positions (the prefix 0..P-1; each branch P, P+1, ...).

        Returns:
            A ``[batch, 1, seq, seq]`` mask (boolean for SDPA, additive float for eager), or a dict of two
            such masks by layer type when the model mixes full and sliding-window layers.

        Raises:
            ValueError: the attention implementation takes no dense mask (see :attr:`supports_segment_masks`).
        """
        if not self.supports_segment_masks:
            raise ValueError(
                f"attention implementation {self.config._attn_implementation!r} takes no 4-D attention mask"
            )
        query_segment, key_segment = segments[:, :, None], segments[:, None, :]
        query_position, key_position = position_ids[:, :, None], position_ids[:, None, :]
        visible = (key_segment == 0) | (key_segment == query_segment)
        allowed = visible & (key_position <= query_position) & (key_segment >= 0) & (query_segment >= 0)
        length = segments.shape[1]
        padding_self = (segments < 0)[:, :, None] & torch.eye(
            length, dtype=torch.bool, device=segments.device
        )[None]
        masks = {}
        for kind in dict.fromkeys(self.layer_types):
            mask = allowed
            if kind == "sliding_attention":
                mask = allowed & (query_position - key_position < self.config.sliding_window)
            masks[kind] = self._mask_format((mask | padding_self)[:, None])
        return next(iter(masks.values())) if len(masks) == 1 else masks

    def _mask_format(self, allowed: torch.Tensor) -> torch.Tensor:
        """A boolean "may attend" mask in the form the attention implementation adds or applies."""
        if self.config._attn_implementation == "sdpa":
            return allowed
        dtype = self.lm_head.weight.dtype
        additive = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
        return additive.masked_fill(~allowed, torch.finfo(dtype).min)

    def run_blocks(self, hidden: torch.Tensor, batch: PreparedBatch, block_indices) -> torch.Tensor:
        """Run the given blocks (original indices, in order) on ``hidden``."""
        for index in block_indices:
            hidden = self.blocks[index](self.to_block_device(index, hidden), **batch.block_kwargs[index])
        return hidden

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final norm and LM head (with the logit soft-capping of architectures that use it)."""
        if self.spread:
            hidden = hidden.to(module_device(self.norm))
        logits = self.lm_head(self.norm(hidden).to(self.device))
        if self.final_logit_softcapping is not None:
            logits = torch.tanh(logits / self.final_logit_softcapping) * self.final_logit_softcapping
        return logits

    def kept_blocks(self, removed_blocks) -> list[int]:
        removed = self.validate_removed(removed_blocks)
        return [i for i in range(self.num_blocks) if i not in removed]

    def final_hidden(
        self,
        input_ids: torch.Tensor,
        removed_blocks=(),
        attention_mask: torch.Tensor | dict | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Hidden states after the last kept block (before the final norm), ``[batch, seq, hidden]``: for
        scoring that needs the head at a few positions only (:meth:`head` on those rows). The mask and
        positions are :meth:`prepare`'s (a packed batch passes its segment mask and restarting positions)."""
        kept = self.kept_blocks(removed_blocks)
        with torch.no_grad():
            batch = self.prepare(input_ids, attention_mask, position_ids)
            return self.run_blocks(batch.hidden, batch, kept)

    def forward(self, input_ids: torch.Tensor, removed_blocks=(), attention_mask: torch.Tensor | None = None):
        """Logits of the model with ``removed_blocks`` skipped (identity), ``[batch, seq, vocab]``."""
        with torch.no_grad():
            return self.head(self.final_hidden(input_ids, removed_blocks, attention_mask))


def module_device(module: nn.Module) -> torch.device:
    """The device a module computes on: accelerate's execution device when a device_map hooked it (its
    weights may then sit elsewhere), else that of its first parameter or buffer."""
    hook = getattr(module, "_hf_hook", None)
    if getattr(hook, "execution_device", None) is not None:
        return torch.device(hook.execution_device)
    for tensor in module.parameters():
        return tensor.device
    for tensor in module.buffers():
        return tensor.device
    return torch.device("cpu")


def _on_device(value, device: torch.device, copies: dict[int, Any]):
    """``value`` (a tensor, or tuples/dicts of them, as block arguments are) with its tensors on ``device``;
    ``copies`` keeps one moved copy per original tensor."""
    if isinstance(value, torch.Tensor):
        if value.device == device:
            return value
        if id(value) not in copies:
            copies[id(value)] = value.to(device)
        return copies[id(value)]
    if isinstance(value, tuple | list):
        return type(value)(_on_device(item, device, copies) for item in value)
    if isinstance(value, dict):
        return {key: _on_device(item, device, copies) for key, item in value.items()}
    return value


def validate_removed(removed_blocks, num_blocks: int) -> frozenset[int]:
    """Check that ``removed_blocks`` are distinct indices in ``[0, num_blocks)`` and leave one block."""
    removed = list(removed_blocks)
    if len(set(removed)) != len(removed):
        duplicates = sorted({i for i in removed if removed.count(i) > 1})
        raise UserError(f"duplicate block indices {duplicates}")
    for index in removed:
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < num_blocks:
            raise UserError(f"block index {index!r} is out of range: blocks are 0..{num_blocks - 1}")
    if len(removed) >= num_blocks:
        raise UserError(f"cannot remove all {num_blocks} blocks; at least one must remain")
    return frozenset(removed)


def parse_block_list(text: str) -> list[int]:
    """Parse ``"3,7,8"`` into ``[3, 7, 8]`` with a one-line error for anything else."""
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items:
        raise UserError("no block indices given (expected e.g. --remove 3,7,8)")
    try:
        return [int(item) for item in items]
    except ValueError:
        raise UserError(f"block indices must be integers separated by commas, got {text!r}") from None
