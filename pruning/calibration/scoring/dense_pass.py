"""The subset evaluator's start-up: where its boundary cache lives, and the dense pass that fills it.

**Boundary cache.** One dense pass at start-up stores the hidden state entering each block (block
boundaries). Blocks before the first removed one are untouched by the removal, so a candidate only runs the
kept blocks from the nearest cached boundary at or before its first removed block. When all boundaries do not
fit the memory budget, evenly spaced ones are kept (fewer boundaries cost a few extra dense blocks per
candidate, never exactness); on a GPU whose budget is too small the cache lives in host memory and is copied
in per batch (:func:`plan_cache`).

**The same pass** also gives what some searches need besides scores, with no extra forward: ShortGPT's Block
Influence, the block-input similarity matrix of LoRP and LLM-Streamline, the KL reference
(:mod:`.reference`) and the dense loss (:class:`DenseReference`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch
from tqdm.auto import tqdm

from ground.core.objectives import Objective
from pruning.calibration.config import CalibrationConfig
from pruning.calibration.objectives import configured_loss
from pruning.calibration.scoring.packing import RunBatch
from pruning.calibration.scoring.reference import KLReference
from pruning.calibration.scoring.runner import BlockRunner
from pruning.calibration.scoring.shortcuts import (
    PrefixStates,
    available_memory_bytes,
    device_free_bytes,
    plan_boundaries,
)
from pruning.calibration.scoring.statistics import input_similarity_sums


@dataclass(frozen=True)
class CachePlan:
    """Where and which boundary states (and the KL reference) are cached."""

    device: torch.device
    """Where the cache lives: the evaluator's device, or the host when the device budget is too small."""
    boundaries: list[int]
    """The cached dense boundaries, sorted (0 always among them; none in naive mode)."""
    budget_bytes: int
    """What the cache may take where it lives."""
    cache_bytes: int
    """What the dense boundaries take."""
    prefix_capacity: int
    """How many more boundaries (trie nodes of the bases searches extend) the budget holds."""
    reference_logprobs: bool
    """Whether the KL reference keeps the dense log-probabilities (else the dense final hidden states)."""


def plan_cache(
    runner: BlockRunner,
    run_batches: list[RunBatch],
    budget_bytes: float | None,
    *,
    naive: bool,
    shortcuts: bool,
    needs_reference: bool,
) -> CachePlan:
    """Decide where and which boundary states (and the KL reference) are cached.

    Args:
        runner: the model's blocks.
        run_batches: what the blocks run (their positions are what a boundary holds).
        budget_bytes: the memory budget; None = half the free GPU memory, or a quarter of the host's.
        naive: cache no boundary.
        shortcuts: keep room for the boundaries of the bases searches extend.
        needs_reference: the objective compares against the dense model.
    """
    stack, device, num_blocks = runner.stack, runner.device, runner.num_blocks
    hidden_size = stack.config.hidden_size
    element = torch.empty((), dtype=stack.lm_head.weight.dtype).element_size()
    positions = sum(run.input_ids.numel() for run in run_batches)
    per_boundary = positions * hidden_size * element
    on_gpu = device.type != "cpu"
    if budget_bytes is None:
        budget_bytes = (0.5 if on_gpu else 0.25) * device_free_bytes(device)
    cache_device = device
    slots = int(budget_bytes // per_boundary) if per_boundary else num_blocks
    if on_gpu and slots < num_blocks:
        # Over the device budget: keep the cache in host memory (half of what is free) instead.
        cache_device = torch.device("cpu")
        budget_bytes = 0.5 * available_memory_bytes()
        slots = int(budget_bytes // per_boundary)
    boundaries = [] if naive else plan_boundaries(num_blocks, slots)
    cache_bytes = len(boundaries) * per_boundary
    reference_bytes = positions * stack.lm_head.weight.shape[0] * 4
    return CachePlan(
        device=cache_device,
        boundaries=boundaries,
        budget_bytes=int(budget_bytes),
        cache_bytes=cache_bytes,
        # What the dense boundaries leave of the budget holds the boundaries of the bases searches extend.
        prefix_capacity=max(slots - len(boundaries), 0) if shortcuts else 0,
        # Dense log-probs when they fit next to the boundaries; else the dense final hidden states.
        reference_logprobs=needs_reference and cache_bytes + reference_bytes <= budget_bytes,
    )


@dataclass
class DenseStates:
    """What the dense reference pass leaves: per run batch, its boundary states and block arguments (not in
    naive mode), and over the data, the block statistics and the dense per-sample losses."""

    influence: np.ndarray
    """``[N]`` ShortGPT Block Influence."""
    similarity: np.ndarray
    """``[N, N]`` block-input similarity, symmetric with a unit diagonal."""
    boundary_states: list[dict[int, torch.Tensor]] = field(default_factory=list)
    """Per run batch, ``{boundary: state entering it}`` for the cached boundaries."""
    block_kwargs: list[list[dict]] = field(default_factory=list)
    """Per run batch, per block, the keyword arguments its forward takes (masks, positions)."""
    losses: list[torch.Tensor] = field(default_factory=list)
    """Per run batch, the dense per-sample losses (float64)."""

    def dense_loss(self) -> float:
        """The calibration loss of the dense model."""
        return float(torch.cat(self.losses).double().mean())

    def batch_order(self) -> list[int]:
        """Run batches by decreasing dense loss: their partial sums bound a candidate's loss from below
        soonest (only the order of the work changes, never a value)."""
        dense_sums = [float(batch_losses.sum()) for batch_losses in self.losses]
        return sorted(range(len(self.losses)), key=lambda index: -dense_sums[index])


class DenseReference:
    """The dense reference pass of one evaluator and what it leaves: where the cache lives (:attr:`plan`),
    the KL reference (:attr:`reference`) and the pass's results (:attr:`states`).

    Args:
        runner: the model's blocks (it counts the pass's work).
        run_batches: what the blocks run.
        config: the calibration configuration.
        objective: its objective's facts.
        budget_bytes: the cache's memory budget (:func:`plan_cache`).
        naive: keep no boundary state, and run the pass only when the KL reference or a block statistic
            is needed.
        shortcuts: keep room for the boundaries of the bases searches extend.
        progress: show a progress bar.
    """

    def __init__(
        self,
        runner: BlockRunner,
        run_batches: list[RunBatch],
        config: CalibrationConfig,
        objective: Objective,
        budget_bytes: float | None,
        *,
        naive: bool,
        shortcuts: bool,
        progress: bool,
    ):
        self.runner, self.run_batches = runner, run_batches
        self.config, self.objective = config, objective
        self.naive, self.progress = naive, progress
        needs_reference = config.needs_reference
        self.plan = plan_cache(
            runner,
            run_batches,
            budget_bytes,
            naive=naive,
            shortcuts=shortcuts,
            needs_reference=needs_reference,
        )
        self.reference = KLReference(
            runner.head, runner.device, self.plan.device, self.plan.reference_logprobs, len(run_batches)
        )
        self.states: DenseStates | None = None
        """The pass's results; None until it has run."""
        if not naive or needs_reference:
            # naive mode caches nothing but the KL reference (part of that objective's definition).
            self.run()

    def statistics(self) -> DenseStates:
        """The pass's results; naive mode runs it only now (its time counted as scoring time)."""
        if self.states is None:
            with self.runner.stats.scoring():
                self.run()
        return self.states

    def prefix_states(self) -> PrefixStates:
        """The trie over the dense boundary states (none in naive mode), with room for the bases' nodes."""
        states = self.states.boundary_states if self.states is not None else []
        return PrefixStates(states, self.plan.boundaries, self.runner.num_blocks, self.plan.prefix_capacity)

    def block_kwargs(self) -> list[list[dict]]:
        """Per run batch, per block, the keyword arguments of its forward (none in naive mode)."""
        return self.states.block_kwargs if self.states is not None else []

    def batch_order(self) -> list[int]:
        """The order run batches are scored in: by decreasing dense loss, in calibration order without one."""
        if self.states is None or not self.states.losses:
            return list(range(len(self.run_batches)))
        return self.states.batch_order()

    def run(self) -> DenseStates:
        """One dense forward over the data: boundary states, KL reference, Block Influence, block-input
        similarity, dense losses (the states and losses only outside naive mode)."""
        runner, stats, num_blocks = self.runner, self.runner.stats, self.runner.num_blocks
        start = time.perf_counter()
        influence = torch.zeros(num_blocks, dtype=torch.float64)
        similarity = torch.zeros(num_blocks, num_blocks, dtype=torch.float64)
        influence_tokens = 0.0
        states = DenseStates(influence=np.empty(0), similarity=np.empty(0))
        bar = tqdm(self.run_batches, desc="dense reference pass", unit="batch", disable=not self.progress)
        with torch.no_grad():
            for batch_index, run in enumerate(bar):
                prepared = runner.stack.prepare(run.input_ids, run.attention_mask, run.position_ids)
                hidden = prepared.hidden
                boundary_states = {}
                # per token of every calibration sequence: a shared prompt token counts once per choice
                weight = run.token_weight
                block_inputs = []
                for index, block in enumerate(runner.blocks):
                    if index in self.plan.boundaries:
                        boundary_states[index] = hidden.to(self.plan.device)
                    # Inputs the cache does not keep are held for this batch only, where the cache lives.
                    block_inputs.append(
                        boundary_states[index] if index in boundary_states else hidden.to(self.plan.device)
                    )
                    hidden = runner.stack.to_block_device(index, hidden)
                    output = block(hidden, **prepared.block_kwargs[index])
                    cosine = torch.nn.functional.cosine_similarity(hidden.float(), output.float(), dim=-1)
                    influence[index] += ((1 - cosine).double() * weight).sum().cpu()
                    hidden = output
                similarity_start = time.perf_counter()
                similarity += input_similarity_sums(block_inputs, weight, runner.device)
                stats.similarity_seconds += time.perf_counter() - similarity_start
                del block_inputs
                runner.count_blocks(run, num_blocks)
                influence_tokens += float(weight.sum())
                if self.config.needs_reference:
                    self.reference.keep(batch_index, run.calibration, hidden)
                if not self.naive:
                    states.block_kwargs.append(prepared.block_kwargs)
                    states.boundary_states.append(boundary_states)
                    states.losses.append(self._dense_losses(batch_index, run, hidden))
        states.influence = (influence / max(influence_tokens, 1)).numpy()
        similarity /= max(influence_tokens, 1)
        # Symmetric up to float rounding by construction; made exact, with LoRP's unit diagonal.
        similarity = (similarity + similarity.T) / 2
        similarity.fill_diagonal_(1.0)
        states.similarity = similarity.numpy()
        self.states = states
        stats.reference_seconds += time.perf_counter() - start
        return states

    def _dense_losses(self, batch_index: int, run: RunBatch, hidden: torch.Tensor) -> torch.Tensor:
        """The dense per-sample losses of one run batch from its final ``hidden`` states (float64)."""
        batch = run.calibration
        # An objective 0 at the dense model by definition (KL to itself) needs no head call; a --kl-weight
        # term is 0 there too, so only the loss it is added to runs.
        if self.objective.zero_loss_at_dense:
            return torch.zeros(batch.num_samples).double()
        reference = self.reference.for_batch(batch_index) if self.objective.needs_reference else None
        loss = configured_loss(self.config, with_kl=False)
        return loss(batch, run.objective_hidden(hidden), self.runner.head, reference).double().cpu()
