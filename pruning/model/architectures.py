"""The decoder architectures depthprune prunes: the one table both model loading and GGUF conversion read.

Kept apart from :mod:`pruning.model.blocks` (torch, block access) so that :mod:`pruning.model.sources` can
check a GGUF's architecture without importing the module that imports it.
"""

from __future__ import annotations

from typing import Any

from ground.core.errors import UserError

SUPPORTED_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "mistral": "MistralForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
}
"""model_type -> the causal-LM class name transformers uses for it."""


def check_supported(config: Any) -> None:
    """Raise a :class:`UserError` naming the supported architectures when ``config`` is not one."""
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_ARCHITECTURES:
        supported = ", ".join(f"{name} ({cls})" for name, cls in SUPPORTED_ARCHITECTURES.items())
        raise UserError(f"unsupported architecture {model_type!r}; supported: {supported}")
