"""Training-free repair (``heal --method patch``): one linear map per removed span, fused into the weights.

This is ReplaceMe (Shopkhoev et al., arXiv 2505.02819; code ``mts-ai/ReplaceMe``, ``lstsq.py`` and
``cosine_dist.py``), read from its code:

* **Activations.** The dense model runs the calibration windows. For a removed span of original blocks
  ``[s, e)``, with ``h_i`` the output of block ``i`` and ``M`` the MLP output of block ``s - 1`` (the last
  kept block before the span), the regression input is ``X = M`` and the target ``Y = h_{e-1} + M - h_{s-1}``:
  the input of the next kept block minus the part of block ``s - 1``'s output that does not pass through its
  MLP (its input plus its attention). A map ``T`` with ``X T ≈ Y`` makes the pruned model's block ``s - 1``
  output ``h_{s-1} - M + M T ≈ h_{e-1}``, what the removed blocks would have given.
* **Estimators** (``--estimator``). ``lstsq`` (ReplaceMe's recommended one, the default): the closed form
  ``T = (XᵀX + αI)⁻¹ XᵀY`` accumulated over every calibration token in float64, ``α`` = ``--ridge``
  (ReplaceMe's ``alpha``, default 0). ``cosine``: ``T`` initialised to the identity and trained with Adam
  (``--lr``, default 1e-4 as ReplaceMe's) to minimise ``1 − mean cos(X T, Y)`` over shuffled batches of 1,024
  tokens for 10 epochs (ReplaceMe's ``adam_method`` with ``accurate: False``).
* **Fusion.** ``T`` is folded into the ``down_proj`` of block ``s - 1``: ``W ← Tᵀ W`` (a bias:
  ``b ← Tᵀ b``), so the child has exactly the parent's modules, shapes, parameter count and speed, and loads
  in transformers and vLLM unchanged.
* **Calibration size** (``--patch-samples``): at most 128 windows by default (ReplaceMe's example configs take
  128 sequences; its reproduction configs 8,000, sized for an 8B model on a GPU).

**Non-contiguous masks**: one map per maximal run of consecutive removed blocks, each fused into the block
before its run (runs are separated by at least one kept block, so no block carries two maps). As in
ReplaceMe's multi-map ``lstsq`` (``num_A > 1``), every map is estimated in one pass on the *dense* model's
activations: a later map does not see the error left by an earlier one.

**Deviations from ReplaceMe**, each deliberate:

* Calibration text is cut into full windows of ``--seq-len`` tokens from the data's heal (else calibration)
  split, the same windows LoRA and distillation train on; ReplaceMe tokenises whole SlimOrca dialogues padded
  to the longest in the batch and regresses on the padding positions too. Here no position is padding.
* The normal equations are solved with ``torch.linalg.solve`` rather than by inverting ``XᵀX + αI``: the
  same minimiser, with less rounding. A singular system (fewer independent tokens than hidden channels) is
  refused with advice instead of producing a map of NaNs.
* A span that starts at block 0 has no block before it. Its map is folded into the input embedding
  (``E ← E T``, ``X`` = the embedding output, ``Y`` = the input of block ``e``) when the embedding is not tied
  to the LM head; with tied embeddings that span is left unpatched and recorded in ``unpatched_spans``
  (folding it would change the LM head too). ReplaceMe never removes block 0.
* A variant that was healed already (a child) is refused: the maps are estimated on the dense model's
  activations, which describe the parent's kept blocks only while they are the dense model's own.
* Architectures whose MLP output is normalised before the residual (Gemma-3's ``post_feedforward_layernorm``)
  are refused: there the map cannot be folded into ``down_proj``.
* Only ReplaceMe's full (non-diagonal) map with the MSE-closed-form or cosine objective; its diagonal,
  lower-triangular and rank-one variants and its other solvers are not offered.

**LinearPatch** (Chen et al., arXiv 2505.24680; code ``chenxinrui-tsinghua/LinearPatch``, ``layer_select.py``,
``block_scaling.py``) is not offered as an estimator: its patch ``P = H diag(s) Hᵀ`` (``H`` a Hadamard matrix,
``s`` per-channel ratios of mean absolute Hadamard-rotated activations at the two boundaries) multiplies the
*whole* residual stream entering the next kept block, which its code applies as an extra matrix in a forward
hook. That cannot be folded into existing weights without changing the residual that the earlier blocks
read, so it would add a d × d matrix per span and change the architecture; ReplaceMe's map acts on the MLP
output only and folds exactly. See docs/healing.md.
"""

from __future__ import annotations

import random
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch.nn import functional

from ground.core.errors import UserError
from pruning.healing.config import COSINE_BATCH_TOKENS, COSINE_EPOCHS, HealConfig

FOLDABLE_ARCHITECTURES = ("llama", "qwen2", "qwen3", "mistral")
"""Architectures whose block output is ``residual + attention + mlp``, the MLP ending in ``down_proj``."""
EMBEDDING = -1
"""``Span.before`` of a span that starts at block 0: its map goes into the input embedding."""


@dataclass(frozen=True)
class Span:
    """A maximal run of removed blocks, original indices ``start`` to ``end - 1``."""

    start: int
    end: int

    @property
    def before(self) -> int:
        """Original index of the kept block that carries the map (:data:`EMBEDDING` for a leading span)."""
        return self.start - 1 if self.start > 0 else EMBEDDING

    def as_list(self) -> list[int]:
        return [self.start, self.end]


def removed_spans(removed_blocks) -> list[Span]:
    """The maximal runs of consecutive indices in ``removed_blocks``, in order."""
    spans: list[Span] = []
    for index in sorted(removed_blocks):
        if spans and spans[-1].end == index:
            spans[-1] = Span(spans[-1].start, index + 1)
        else:
            spans.append(Span(index, index + 1))
    return spans


def check_foldable(model_type: str) -> None:
    """Refuse an architecture whose MLP output cannot carry the map (before any weight loads)."""
    if model_type not in FOLDABLE_ARCHITECTURES:
        raise UserError(
            f"--method patch folds its map into the MLP's down_proj, which {model_type!r} normalises before "
            f"the residual; it supports {', '.join(FOLDABLE_ARCHITECTURES)} (use --method lora or distill)"
        )


def pick_windows(windows: list[list[int]], samples: int, seed: int) -> list[list[int]]:
    """At most ``samples`` of ``windows``, a seeded draw kept in the text's order."""
    if len(windows) <= samples:
        return windows
    chosen = sorted(random.Random(seed).sample(range(len(windows)), samples))
    return [windows[index] for index in chosen]


@dataclass
class SpanStatistics:
    """What one span's estimator needs, accumulated over the calibration tokens (float64)."""

    gram: torch.Tensor
    """``XᵀX``, hidden × hidden."""
    cross: torch.Tensor
    """``XᵀY``, hidden × hidden."""
    target_energy: float = 0.0
    """``‖Y‖²``: with ``gram`` and ``cross`` it gives any map's squared error on the calibration tokens."""
    rows: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)
    """``(X, Y)`` float32 rows on the CPU, kept for the cosine estimator only."""

    def add(self, inputs: torch.Tensor, targets: torch.Tensor, keep_rows: bool) -> None:
        inputs, targets = inputs.double(), targets.double()
        self.gram += (inputs.T @ inputs).to(self.gram.device)
        self.cross += (inputs.T @ targets).to(self.cross.device)
        self.target_energy += float((targets * targets).sum())
        if keep_rows:
            self.rows.append((inputs.float().cpu(), targets.float().cpu()))

    def squared_error(self, transform: torch.Tensor) -> float:
        """``‖X T − Y‖²`` over the calibration tokens."""
        transform = transform.double().to(self.gram.device)
        quadratic = torch.trace(transform.T @ self.gram @ transform)
        return float(quadratic - 2 * torch.trace(transform.T @ self.cross)) + self.target_energy


@contextmanager
def captured_output(module):
    """Within the block, ``holder[0]`` is the output of ``module``'s latest call."""
    holder: list[torch.Tensor | None] = [None]
    handle = module.register_forward_hook(lambda _module, _inputs, output: holder.__setitem__(0, output))
    try:
        yield holder
    finally:
        handle.remove()


def _flat(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.reshape(-1, tensor.shape[-1])


@torch.no_grad()
def _gather_batch(stack, input_ids: torch.Tensor, spans: list[Span], statistics, keep_rows: bool) -> None:
    """Run the dense blocks up to the last span's end on one batch, adding each span's ``(X, Y)``."""
    prepared = stack.prepare(input_ids)
    hidden = prepared.hidden
    pending: dict[int, tuple[int, torch.Tensor, torch.Tensor]] = {}  # span end -> (span, X, residual part)
    for number, span in enumerate(spans):
        if span.before == EMBEDDING:
            pending[span.end] = (number, hidden, torch.zeros_like(hidden))
    starts = {span.before: number for number, span in enumerate(spans) if span.before != EMBEDDING}
    for index in range(spans[-1].end):
        if index in starts:
            with captured_output(stack.blocks[index].mlp) as mlp_output:
                hidden = stack.run_blocks(hidden, prepared, [index])
            span = spans[starts[index]]
            pending[span.end] = (starts[index], mlp_output[0], hidden - mlp_output[0].to(hidden.device))
        else:
            hidden = stack.run_blocks(hidden, prepared, [index])
        if index + 1 in pending:
            number, inputs, residual = pending.pop(index + 1)
            target = hidden - residual.to(hidden.device)
            statistics[number].add(_flat(inputs), _flat(target).to(inputs.device), keep_rows)


def gather_statistics(dense, windows: list[list[int]], spans: list[Span], config: HealConfig, progress=None):
    """The per-span :class:`SpanStatistics` of the dense model over ``windows``.

    Args:
        dense: the dense base model (a transformers causal LM).
        windows: calibration token windows, all of one length.
        spans: :func:`removed_spans` of the variant.
        config: the run (``batch_size``, ``estimator``).
        progress: called with the number of windows done after each batch (a progress bar's ``update``).
    """
    from pruning.model.blocks import BlockStack

    stack = BlockStack(dense)
    hidden_size = stack.config.hidden_size
    device = stack.device
    statistics = [
        SpanStatistics(
            torch.zeros(hidden_size, hidden_size, dtype=torch.float64, device=device),
            torch.zeros(hidden_size, hidden_size, dtype=torch.float64, device=device),
        )
        for _ in spans
    ]
    for start in range(0, len(windows), config.batch_size):
        batch = windows[start : start + config.batch_size]
        input_ids = torch.tensor(batch, device=stack.input_device)
        _gather_batch(stack, input_ids, spans, statistics, keep_rows=config.estimator == "cosine")
        if progress is not None:
            progress(len(batch))
    return statistics


def least_squares_map(statistics: SpanStatistics, ridge: float) -> torch.Tensor:
    """``(XᵀX + ridge·I)⁻¹ XᵀY`` in float64.

    Raises:
        UserError: the system is singular (too few independent calibration tokens for the hidden size).
    """
    gram = statistics.gram + ridge * torch.eye(
        statistics.gram.shape[0], dtype=torch.float64, device=statistics.gram.device
    )
    try:
        transform = torch.linalg.solve(gram, statistics.cross)
    except RuntimeError:  # torch.linalg.LinAlgError subclasses RuntimeError
        transform = None
    if transform is None or not bool(torch.isfinite(transform).all()):
        raise UserError(
            "the calibration activations do not determine the patch (a singular system): give more text "
            "(--patch-samples, --seq-len) or a ridge term (--ridge 1e-3)"
        )
    return transform


def cosine_map(statistics: SpanStatistics, lr: float, seed: int, device) -> torch.Tensor:
    """``T`` from the identity by Adam on ``1 − mean cos(X T, Y)`` (ReplaceMe's ``adam_method``), float64."""
    inputs = torch.cat([rows[0] for rows in statistics.rows])
    targets = torch.cat([rows[1] for rows in statistics.rows])
    transform = torch.eye(inputs.shape[1], device=device, requires_grad=True)
    optimizer = torch.optim.Adam([transform], lr=lr)
    generator = torch.Generator().manual_seed(seed)
    with torch.enable_grad():
        for _ in range(COSINE_EPOCHS):
            order = torch.randperm(inputs.shape[0], generator=generator)
            for start in range(0, inputs.shape[0], COSINE_BATCH_TOKENS):
                rows = order[start : start + COSINE_BATCH_TOKENS]
                optimizer.zero_grad(set_to_none=True)
                mapped = inputs[rows].to(device) @ transform
                loss = 1 - functional.cosine_similarity(mapped, targets[rows].to(device), dim=1).mean()
                loss.backward()
                optimizer.step()
    return transform.detach().double()


def estimate_maps(statistics: list[SpanStatistics], config: HealConfig, device) -> list[torch.Tensor]:
    """One map per span by ``config.estimator``."""
    if config.estimator == "cosine":
        return [cosine_map(span, config.lr, config.seed, device) for span in statistics]
    return [least_squares_map(span, config.ridge) for span in statistics]


def is_tied(causal_lm) -> bool:
    """Whether the LM head's matrix is the input embedding's."""
    return causal_lm.lm_head.weight is causal_lm.get_input_embeddings().weight


@torch.no_grad()
def fuse_map(causal_lm, kept_to_original: list[int], span: Span, transform: torch.Tensor) -> str:
    """Fold ``transform`` into the weights of the pruned model that feed the span's place.

    Args:
        causal_lm: the pruned variant (its blocks renumbered; ``kept_to_original`` maps them back).
        kept_to_original: the variant's block ``i`` is the dense model's block ``kept_to_original[i]``.
        span: where the map goes (:attr:`Span.before`).
        transform: the map, hidden × hidden, acting on row vectors.

    Returns:
        The name of the weight that now carries the map.
    """
    if span.before == EMBEDDING:
        embedding = causal_lm.get_input_embeddings()
        embedding.weight.copy_(
            (embedding.weight.double() @ transform.to(embedding.weight.device)).to(embedding.weight.dtype)
        )
        return "model.embed_tokens.weight"
    position = kept_to_original.index(span.before)
    down = causal_lm.model.layers[position].mlp.down_proj
    transposed = transform.T.to(down.weight.device)
    down.weight.copy_((transposed @ down.weight.double()).to(down.weight.dtype))
    if down.bias is not None:
        down.bias.copy_((transposed @ down.bias.double()).to(down.bias.dtype))
    return f"model.layers.{position}.mlp.down_proj.weight"
