"""Fused block forwards for the subset evaluator (``fused_blocks``; off by default, refused on the CPU).

On a GPU a decoder block's forward is about two-thirds matrix products; most of the rest is elementwise
kernels (RMSNorm's ``pow``/``mean``/``mul``, rotary embeddings, SwiGLU, residual adds, dtype casts), each a
full pass over the activations (``docs/gpu.md``). ``torch.compile`` (TorchInductor, built into torch) fuses
them into a few generated kernels and leaves the matrix products and attention to cuBLAS and the SDPA kernels.
Liger-Kernel's fused RMSNorm/rotary/SwiGLU kernels would do the same by hand, but are a package to install
(the GPU machines here have no network) and patch the model's modules in place; compile needs nothing.

One compiled function, ``block(hidden, **kwargs)`` with the block passed as an argument, serves every block:
since torch 2.5 dynamo inlines ``nn.Module`` calls and takes the parameters as graph inputs, so the blocks of
one class share one graph per input shape (``dynamic=False``: a batch of another size is one more graph,
never a slower dynamic one). Graphs are counted by the backend (:class:`FusionStats`), and the first call of
each shape is timed apart as compile time, so a benchmark can report it beside the search's time.
Inductor is told to round where eager rounds (``emulate_precision_casts``), so a fused block's bfloat16
output stays as close to the model's own as fusion allows; the scores are then equal within rounding, not
bit for bit (the evaluator's exactness is checked against the unfused scores by ``benchmarks.gpu_fused``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from ground.core.errors import UserError

RECOMPILE_LIMIT = 64
"""Graphs one compiled function may hold (one per batch shape and grad mode); dynamo's default of 8 would
silently fall back to the unfused forward past it."""


@dataclass
class FusionStats:
    """What compiling the block forward cost, shared by every evaluator of a process (graphs are reused)."""

    backend: str
    """The ``torch.compile`` backend (``inductor`` on a GPU; ``eager`` in the CPU tests)."""
    graphs: int = 0
    """Graphs the backend compiled (one per input shape when the blocks share one)."""
    compile_seconds: float = 0.0
    """Wall seconds of the first call of each input shape (tracing, code generation and one forward)."""
    shapes: list[str] = field(default_factory=list)
    """The input shapes compiled for, in order."""


class _CompiledForward:
    """One compiled ``block(hidden, **kwargs)`` and its stats."""

    def __init__(self, backend: str):
        self.stats = FusionStats(backend)
        compiler = torch._dynamo.lookup_backend(backend)

        def counted(graph, example_inputs):
            self.stats.graphs += 1
            if backend == "inductor":
                import torch._inductor.config as inductor_config

                if hasattr(inductor_config, "emulate_precision_casts"):
                    with inductor_config.patch(emulate_precision_casts=True):
                        return compiler(graph, example_inputs)
            return compiler(graph, example_inputs)

        self.forward = torch.compile(_block_forward, backend=counted, dynamic=False)
        self.seen: set[tuple] = set()

    def __call__(self, block, hidden: torch.Tensor, kwargs: dict) -> torch.Tensor:
        key = (tuple(hidden.shape), hidden.dtype, str(hidden.device), torch.is_grad_enabled(), type(block))
        if key in self.seen:
            return self.forward(block, hidden, **kwargs)
        synchronize(hidden.device)
        start = time.perf_counter()
        output = self.forward(block, hidden, **kwargs)
        synchronize(hidden.device)
        self.stats.compile_seconds += time.perf_counter() - start
        self.stats.shapes.append("x".join(str(size) for size in hidden.shape))
        self.seen.add(key)
        return output


def _block_forward(block, hidden, **kwargs):
    return block(hidden, **kwargs)


_COMPILED: dict[str, _CompiledForward] = {}


class FusedBlocks(Sequence):
    """The blocks of a model, each called through the one compiled forward (indexable like the blocks)."""

    def __init__(self, blocks, compiled: _CompiledForward):
        self._blocks = blocks
        self._compiled = compiled

    @property
    def stats(self) -> FusionStats:
        return self._compiled.stats

    def __len__(self) -> int:
        return len(self._blocks)

    def __getitem__(self, index: int) -> Callable[..., torch.Tensor]:
        block = self._blocks[index]
        return lambda hidden, **kwargs: self._compiled(block, hidden, kwargs)


def fused_blocks(blocks, device: torch.device, fusion: bool | str = True) -> FusedBlocks:
    """The blocks called through one compiled forward per process and backend.

    Args:
        blocks: the model's decoder blocks (``BlockStack.blocks``).
        device: where they run.
        fusion: ``True`` for TorchInductor (CUDA only), or the name of a ``torch.compile`` backend
            (``eager`` traces and reuses graphs without generating code: the CPU tests' check).

    Raises:
        UserError: ``True`` on the CPU (fusion is for GPUs: inductor's CPU code is not what is measured).
    """
    backend = "inductor" if fusion is True else str(fusion)
    if backend == "inductor" and torch.device(device).type != "cuda":
        raise UserError("fused_blocks is for CUDA devices; on the CPU leave it off")
    limits = {"recompile_limit": RECOMPILE_LIMIT, "cache_size_limit": RECOMPILE_LIMIT}
    for name, limit in limits.items():  # recompile_limit since torch 2.7, cache_size_limit before
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, max(getattr(torch._dynamo.config, name), limit))
    if backend not in _COMPILED:
        _COMPILED[backend] = _CompiledForward(backend)
    return FusedBlocks(blocks, _COMPILED[backend])


def synchronize(device: torch.device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
