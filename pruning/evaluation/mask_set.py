"""Evaluate many removal sets of one model from its dense weights, sharing every block prefix they share.

A variant that depth pruning wrote (no healing) is its dense model with some blocks skipped, so its scores
need no checkpoint: the dense model run with those blocks removed computes them. A study evaluates hundreds of
such variants on the same requests; run one by one, each recomputes the blocks before its first removed block,
and two masks that agree up to block k recompute the same k blocks. :class:`MaskSetEngine` loads the dense
model once and, per request batch, walks the masks depth first through the trie of removal sets (the subset
evaluator's :func:`~pruning.calibration.scoring.shortcuts.trie_order`;
:func:`~pruning.evaluation.packed_scoring.score_masks`, which the torch engine's own scoring runs with the
one mask ``()``), keeping the hidden state at each boundary where a later mask branches off, so every
shared prefix runs once. The study's 241 SmolLM2 masks
run 3,020 block forwards per batch instead of 5,223.

Exactness: each mask's hidden states are computed by the same blocks, in the same order, on the same inputs as
:meth:`~pruning.model.blocks.BlockStack.final_hidden` with that removal set, so every score equals the one of
that path bit for bit (a test checks it, and that it equals scoring the pruned checkpoint up to float
rounding). The requests are batched exactly as :func:`~pruning.evaluation.packed_scoring.score_packed` batches
them (shared question prefixes, the LM head at scored positions only).

Memory: besides the model, at most one hidden state per boundary of the walk, ``[batch tokens, hidden]`` each;
:func:`state_budget_tokens` lowers the batch so those states fit a budget (on CUDA a 32-block model at 16,384
tokens of 4,096 hidden in bfloat16 would hold 4 GiB of them).

The engine scores only (an lm-eval ``loglikelihood`` and perplexity windows); a suite that generates text
needs the variant's checkpoint.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ground.core.errors import UserError
from pruning.calibration.scoring.shortcuts import device_free_bytes
from pruning.evaluation.engines import ScoreRequest, ScoreResult, TorchEngine, fit_to_length
from pruning.evaluation.packed_scoring import Mask, score_masks
from pruning.model.blocks import BlockStack

STATE_BUDGET_FRACTION = 0.25
"""Share of the memory free after loading that the walk's saved hidden states may take."""


def as_mask(removed_blocks: Iterable[int]) -> Mask:
    return tuple(sorted(set(int(block) for block in removed_blocks)))


def state_budget_tokens(stack: BlockStack, batch_tokens: int, free_bytes: int) -> int:
    """``batch_tokens`` halved until the walk's saved states (one per block) fit
    :data:`STATE_BUDGET_FRACTION` of ``free_bytes``; at least 256 tokens."""
    per_token = stack.num_blocks * int(stack.config.hidden_size) * stack.lm_head.weight.element_size()
    budget = STATE_BUDGET_FRACTION * free_bytes
    while batch_tokens > 256 and batch_tokens * per_token > budget:
        batch_tokens //= 2
    return batch_tokens


class MaskSetEngine:
    """The dense model loaded once, scoring the same requests for a fixed set of removal sets.

    :meth:`view` gives one mask's engine (what :func:`~pruning.evaluation.suites.evaluate_with_engine`
    takes). The first view asked to score a list of requests scores it for every mask; the others find
    their scores cached, so an evaluation run mask after mask costs one walk per request list.

    Args:
        model: the dense checkpoint directory or hub id.
        masks: the removal sets to evaluate (``()`` for the dense model itself).
        dtype, device, gpus, batch_tokens, max_length: as :class:`~pruning.evaluation.engines.TorchEngine`.
    """

    name = "torch"

    def __init__(
        self,
        model: str,
        masks: Iterable[Iterable[int]],
        *,
        dtype: str = "float32",
        device: str = "cpu",
        gpus: int = 1,
        batch_tokens: int = 16384,
        max_length: int | None = None,
    ):
        from pruning.model.sources import resolve_model

        model = resolve_model(model).model  # a GGUF file or an embedded name: its converted checkpoint
        self.engine = TorchEngine(model, dtype=dtype, device=device, max_length=max_length, gpus=gpus)
        stack = self.engine._block_stack()
        if stack is None:
            self.engine.close()
            raise UserError(f"{model}: evaluating masks needs an architecture whose blocks depthprune knows")
        self.stack = stack
        self.masks = [as_mask(mask) for mask in masks]
        for mask in self.masks:
            stack.validate_removed(mask)
        self.tokenizer = self.engine.tokenizer
        self.max_length = self.engine.max_length
        self.batch_tokens = state_budget_tokens(stack, batch_tokens, device_free_bytes(stack.device))
        self._scored: dict[tuple[ScoreRequest, ...], dict[Mask, list[ScoreResult]]] = {}

    def view(self, removed_blocks: Iterable[int]) -> MaskView:
        mask = as_mask(removed_blocks)
        if mask not in self.masks:
            raise ValueError(f"mask {list(mask)} is not one of this engine's")
        return MaskView(self, mask)

    def scores(self, mask: Mask, requests: Sequence[ScoreRequest], progress: bool) -> list[ScoreResult]:
        key = tuple(requests)
        if key not in self._scored:
            fitted = [fit_to_length(request, self.max_length) for request in requests]
            contexts = [request.context for request in requests]
            scored = score_masks(self.stack, self.masks, contexts, fitted, self.batch_tokens, progress)
            self._scored[key] = {
                each: [
                    ScoreResult(logprob, greedy, tokens)
                    for (logprob, greedy), (_, tokens) in zip(pairs, fitted, strict=True)
                ]
                for each, pairs in scored.items()
            }
        return self._scored[key][mask]

    def close(self) -> None:
        """Release the model and the cached scores."""
        self._scored.clear()
        self.engine.close()


class MaskView:
    """One mask of a :class:`MaskSetEngine`, with the engine interface evaluation uses for scoring."""

    name = "torch"

    def __init__(self, shared: MaskSetEngine, mask: Mask):
        self.shared, self.mask = shared, mask
        self.tokenizer, self.max_length = shared.tokenizer, shared.max_length

    def score(self, requests: Sequence[ScoreRequest], progress: bool = False) -> list[ScoreResult]:
        return self.shared.scores(self.mask, requests, progress)

    def generate(self, prompts, **_options):
        raise UserError(
            "evaluating a mask from the dense weights scores only; a suite that generates text needs the "
            "variant's checkpoint"
        )

    def close(self) -> None:
        """Nothing to release: the shared engine holds the model."""
