"""Which evaluation engine a run uses, decided without loading one: ``auto`` → vLLM when installed, else
torch.

The memory planner (:mod:`pruning.runtime.plans`) needs the answer before any weight loads, and the engines
themselves (:mod:`pruning.evaluation.engines`) need it to open one; the decision lives here, below both.
"""

from __future__ import annotations

import importlib.util

from ground.core.errors import UserError

ENGINES = ("auto", "vllm", "torch")
# Earlier name of the torch engine, still accepted on the command line.
ENGINE_ALIASES = {"hf": "torch"}


def cuda_available() -> bool:
    """Whether torch is installed and sees a CUDA device."""
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def vllm_installed() -> bool:
    """Whether vLLM (GPU or CPU build) can be imported."""
    return importlib.util.find_spec("vllm") is not None


def resolve_engine(engine: str) -> str:
    """``auto`` -> ``vllm`` when vLLM is installed, else ``torch``; checks the name."""
    engine = ENGINE_ALIASES.get(engine, engine)
    if engine not in ENGINES:
        raise UserError(f"unknown engine {engine!r}; use one of {', '.join(ENGINES)}")
    if engine == "vllm" and not vllm_installed():
        raise UserError(
            "engine 'vllm' requested but vLLM is not installed (install depthprune[cpu] or [gpu]), "
            "or use --engine torch"
        )
    if engine == "auto":
        return "vllm" if vllm_installed() else "torch"
    return engine
