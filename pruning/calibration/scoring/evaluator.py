"""The fast subset evaluator: ``score(removed_blocks) -> calibration loss``, what every search calls.

Exact — a score equals the calibration loss of the pruned checkpoint (the dense model run with those
blocks skipped) — and much cheaper than a full forward per candidate:

* **Boundary cache.** One dense pass at start-up stores the hidden state entering each block (block
  boundaries). Blocks before the first removed one are untouched by the removal, so a candidate only runs
  the kept blocks from the nearest cached boundary at or before its first removed block. When all
  boundaries do not fit ``memory_budget_gb``, evenly spaced ones are kept (fewer boundaries cost a few extra
  dense blocks per candidate, never exactness); on a GPU whose budget is too small the cache lives in host
  memory and is copied in per batch.
* **Memo.** Scores are memoised by removed set (GA and BO revisit subsets), and can be saved to / loaded from
  JSON so that an interrupted search resumes without re-scoring.
* **Shortcuts** (:mod:`.shortcuts`; ``shortcuts=False`` turns both off, to check that nothing changes).
  The boundaries of the *bases* a search extends (greedy's current set, beam's states) are cached too, so a
  candidate base ∪ {j} runs from block j instead of from the dense boundary before its first removed block;
  a group of sets (:meth:`SubsetEvaluator.score_many`) runs depth first through the trie of removal sets, a
  shared prefix once per batch. A ranking query (:meth:`SubsetEvaluator.rank_lowest`) stops scoring a
  candidate once a lower bound of its loss (perplexity, KL) exceeds the k-th best loss so far; the memo
  keeps such a score as a *bound*, never as a value, and completes it when a value is asked for.
* **Batched sequences**, and the **LM head only where needed**: at the answer positions for ``task_margin``
  (its logits are a small fraction of the tokens).
* **Shared prompts** (``task_margin``): each question runs as ONE sequence, its prompt followed by every
  choice, with a mask that keeps the choices apart (:mod:`.packing`), so a candidate computes the
  prompt once instead of once per choice. Models whose attention takes no 4-D mask (flash attention) run
  one sequence per choice instead.
* **KL reference.** ``kl`` needs the dense next-token distribution: its log-probabilities
  (``samples × seq_len × vocab`` floats) are cached once when they fit the budget; otherwise only the
  dense final hidden states are kept and the dense LM head is re-run per candidate (for a 128k vocabulary
  and 64×2048 tokens the log-probabilities would take 64 GiB, the hidden states 2 GiB).

``naive=True`` is the SLEB way, kept for the benchmark: a full forward per candidate (every block, the LM
head on every position, one sequence per choice), no boundary cache, no memo and no packing.

The evaluator also provides what some searches need besides scores: single-block scores (the prior),
per-sample residual-branch gradients (CBO), ShortGPT's Block Influence, and the block-input similarity
matrix of LoRP and LLM-Streamline. The last two come from the dense reference pass itself (no extra forward).
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from depthprune.errors import UserError
from depthprune.files import write_text_atomically
from pruning.calibration.objectives import CalibrationBatch, CalibrationConfig, get_objective, make_batches
from pruning.calibration.packing import RunBatch, as_run_batch, pack_choice_batches
from pruning.calibration.shortcuts import (
    LOSS_FLOORS,
    LowestLosses,
    PartialScore,
    Prefix,
    PrefixStates,
    branch_points,
    exceeds,
    spaced,
    trie_order,
)
from pruning.models import BlockStack, load_config, load_model, validate_removed

MEMO_FORMAT = 1

SIMILARITY_CHUNK_ELEMENTS = 2**25
"""Floats per chunk of the block-input similarity (blocks × positions × hidden): 128 MiB in float32."""


@dataclass
class EvaluatorStats:
    """Work counters of one evaluator; the registry stores them per search."""

    block_forwards: int = 0
    """Decoder-block calls, each on one batch of sequences (a full pass over the data costs N × batches)."""
    tokens: int = 0
    """Token positions run through decoder blocks, summed over block calls (padding included)."""
    evaluations: int = 0
    """Removal sets actually scored (distinct ones, as repeats hit the memo; naive mode scores every call)."""
    memo_hits: int = 0
    """Scores answered from the memo."""
    head_positions: int = 0
    """Positions sent through the LM head."""
    stopped_early: int = 0
    """Ranking answers given by a lower bound: candidates whose scoring stopped before the last batch."""
    bounds_completed: int = 0
    """Stopped candidates later scored to the end because their value was asked for."""
    wall_seconds: float = 0.0
    """Wall time spent scoring, in gradients, and in a dense pass that naive mode runs only when Block
    Influence or the block-input similarity is asked for (start-up excluded)."""
    setup_seconds: float = 0.0
    """Wall time of start-up: data, model and the dense reference pass."""
    reference_seconds: float = 0.0
    """Wall time of the dense reference pass alone (part of ``setup_seconds``)."""
    similarity_seconds: float = 0.0
    """Wall time of the block-input similarity matrix (part of ``reference_seconds``)."""


def available_memory_bytes() -> int:
    """Host memory available now (psutil when installed, else the page counts of the OS)."""
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:  # pragma: no cover - psutil comes with the pinned environment
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def plan_boundaries(num_blocks: int, slots: int) -> list[int]:
    """Which block boundaries to cache when only ``slots`` fit: evenly spaced, always including 0.

    Boundary ``k`` is the hidden state entering block ``k`` (0 is the embedding output).
    """
    if slots >= num_blocks:
        return list(range(num_blocks))
    slots = max(slots, 1)
    return sorted({math.floor(j * num_blocks / slots) for j in range(slots)})


class SubsetEvaluator:
    """Scores removal sets under one calibration configuration (implements ``SubsetObjective``).

    Build it with :func:`build_evaluator`. ``batches`` are the calibration batches (one sequence per text
    window or per choice); ``run_batches`` are what the blocks run (choices packed per question unless
    ``naive``, ``pack_choices=False`` or an attention implementation without 4-D masks, with up to
    ``packed_rows`` questions per forward: default, as many as the largest batch has sequences).
    """

    def __init__(
        self,
        stack: BlockStack,
        config: CalibrationConfig,
        batches: list[CalibrationBatch],
        *,
        model_id: str,
        dtype: str = "float32",
        memory_budget_gb: float | None = None,
        naive: bool = False,
        progress: bool = True,
        pack_choices: bool = True,
        packed_rows: int | None = None,
        shortcuts: bool = True,
    ):
        self.stack = stack
        self.config = config
        self.model_id = model_id
        self.dtype = dtype
        self.naive = naive
        self.shortcuts = shortcuts and not naive
        self.progress = progress
        self.objective = get_objective(config.objective)
        self.loss_floor = LOSS_FLOORS.get(config.objective)
        self.num_blocks = stack.num_blocks
        self.device = stack.device
        self.batches = [batch.to(self.device) for batch in batches]
        self.packed = (
            pack_choices
            and not naive
            and self.objective.data_kind == "multiple_choice"
            and stack.supports_segment_masks
        )
        if self.packed:
            rows = packed_rows or max(batch.input_ids.shape[0] for batch in batches)
            runs = pack_choice_batches([batch.to("cpu") for batch in batches], stack, rows)
        else:
            runs = [as_run_batch(batch) for batch in batches]
        self.run_batches: list[RunBatch] = [run.to(self.device) for run in runs]
        self.num_samples = sum(batch.num_samples for batch in batches)
        self.stats = EvaluatorStats()
        self._memo: dict[frozenset[int], float] = {}
        # Scores stopped early by a ranking query: lower bounds, never values (kept apart from the memo).
        self._bounds: dict[frozenset[int], PartialScore] = {}
        # Per-sample losses of the batches minibatch scores ran, per set: sample index -> loss (score_samples;
        # never memo values, which are full losses).
        self._sample_losses: dict[frozenset[int], dict[int, float]] = {}
        self._single_scores: np.ndarray | None = None
        self._influence: np.ndarray | None = None
        self._similarity: np.ndarray | None = None
        self._gradients: np.ndarray | None = None
        stack.model.requires_grad_(False)  # only the residual scales α ever need gradients
        budget = memory_budget_gb * 2**30 if memory_budget_gb is not None else None
        self._plan_cache(budget)
        self._states: list[dict[int, torch.Tensor]] = []
        self._prepared: list[list[dict]] = []
        self._reference: list[torch.Tensor | None] = [None] * len(self.batches)
        self._batch_order = list(range(len(self.run_batches)))
        if not naive or self.objective.needs_reference:
            # naive mode caches nothing but the KL reference (part of that objective's definition).
            self._dense_pass()
        self._prefix = PrefixStates(self._states, self.boundaries, self.num_blocks, self.prefix_capacity)

    # ------------------------------------------------------------------------------------------ set-up

    def _plan_cache(self, budget_bytes: float | None) -> None:
        """Decide where and which boundary states (and the KL reference) are cached."""
        hidden_size = self.stack.config.hidden_size
        element = torch.empty((), dtype=self.stack.lm_head.weight.dtype).element_size()
        positions = sum(run.input_ids.numel() for run in self.run_batches)
        per_boundary = positions * hidden_size * element
        on_gpu = self.device.type != "cpu"
        if budget_bytes is None:
            if on_gpu:
                free, _ = torch.cuda.mem_get_info(self.device)
                budget_bytes = 0.5 * free
            else:
                budget_bytes = 0.25 * available_memory_bytes()
        self.cache_device = self.device
        slots = int(budget_bytes // per_boundary) if per_boundary else self.num_blocks
        if on_gpu and slots < self.num_blocks:
            # Over the device budget: keep the cache in host memory (half of what is free) instead.
            self.cache_device = torch.device("cpu")
            budget_bytes = 0.5 * available_memory_bytes()
            slots = int(budget_bytes // per_boundary)
        self.boundaries = [] if self.naive else plan_boundaries(self.num_blocks, slots)
        self.cache_budget_bytes = int(budget_bytes)
        self.cache_bytes = len(self.boundaries) * per_boundary
        # What the dense boundaries leave of the budget holds the boundaries of the bases searches extend.
        self.prefix_capacity = max(slots - len(self.boundaries), 0) if self.shortcuts else 0
        vocab = self.stack.lm_head.weight.shape[0]
        reference_bytes = positions * vocab * 4
        # Dense log-probs when they fit next to the boundaries; else the dense final hidden states.
        self.cache_reference_logprobs = (
            self.objective.needs_reference and self.cache_bytes + reference_bytes <= budget_bytes
        )

    def _count_blocks(self, batch: CalibrationBatch | RunBatch, blocks: int) -> None:
        self.stats.block_forwards += blocks
        self.stats.tokens += blocks * batch.input_ids.numel()

    def _head(self, hidden: torch.Tensor) -> torch.Tensor:
        self.stats.head_positions += hidden.shape[0]
        return self.stack.head(hidden)

    def _dense_pass(self) -> None:
        """One dense forward over the data: boundary states, KL reference, Block Influence, block-input
        similarity, dense loss."""
        start = time.perf_counter()
        self._states, self._prepared, self._reference = [], [], []
        influence = torch.zeros(self.num_blocks, dtype=torch.float64)
        similarity = torch.zeros(self.num_blocks, self.num_blocks, dtype=torch.float64)
        influence_tokens = 0.0
        losses = []
        bar = tqdm(self.run_batches, desc="dense reference pass", unit="batch", disable=not self.progress)
        with torch.no_grad():
            for run in bar:
                batch = run.calibration
                prepared = self.stack.prepare(run.input_ids, run.attention_mask, run.position_ids)
                hidden = prepared.hidden
                states = {}
                # per token of every calibration sequence: a shared prompt token counts once per choice
                weight = run.token_weight
                block_inputs = []
                for index, block in enumerate(self.stack.blocks):
                    if index in self.boundaries:
                        states[index] = hidden.to(self.cache_device)
                    # Inputs the cache does not keep are held for this batch only, where the cache lives.
                    block_inputs.append(states[index] if index in states else hidden.to(self.cache_device))
                    output = block(hidden, **prepared.block_kwargs[index])
                    cosine = torch.nn.functional.cosine_similarity(hidden.float(), output.float(), dim=-1)
                    influence[index] += ((1 - cosine).double() * weight).sum().cpu()
                    hidden = output
                similarity += self._input_similarity_sums(block_inputs, weight)
                del block_inputs
                self._count_blocks(run, self.num_blocks)
                influence_tokens += float(weight.sum())
                reference = None
                if self.objective.needs_reference:
                    if self.cache_reference_logprobs:
                        logprobs = torch.log_softmax(self._head(hidden).float(), dim=-1)
                        reference = logprobs.to(self.cache_device)
                    else:
                        reference = hidden.to(self.cache_device)
                self._reference.append(reference)
                if not self.naive:
                    self._prepared.append(prepared.block_kwargs)
                    self._states.append(states)
                    # KL of the dense model to itself is 0 by definition; no head call needed.
                    losses.append(
                        torch.zeros(batch.num_samples)
                        if self.objective.needs_reference
                        else self.objective.loss(batch, run.objective_hidden(hidden), self._head, None)
                        .double()
                        .cpu()
                    )
        self._influence = (influence / max(influence_tokens, 1)).numpy()
        similarity /= max(influence_tokens, 1)
        # Symmetric up to float rounding by construction; made exact, with LoRP's unit diagonal.
        similarity = (similarity + similarity.T) / 2
        similarity.fill_diagonal_(1.0)
        self._similarity = similarity.numpy()
        if not self.naive:
            self._memo[frozenset()] = float(torch.cat(losses).double().mean())
            # Batches with the highest dense loss are scored first: their partial sums bound a candidate's
            # loss from below soonest (only the order of the work changes, never a value).
            dense_sums = [float(batch_losses.sum()) for batch_losses in losses]
            self._batch_order = sorted(range(len(losses)), key=lambda index: -dense_sums[index])
        self.stats.reference_seconds += time.perf_counter() - start

    def _input_similarity_sums(self, block_inputs: list[torch.Tensor], weight: torch.Tensor) -> torch.Tensor:
        """``[N, N]`` Σ_t w_t · x̂_i,t · x̂_j,t over one batch's real positions (LoRP eqs. 3-4, unnormalised).

        Args:
            block_inputs: the N hidden states entering the blocks, ``[rows, width, hidden]`` each.
            weight: ``[rows, width]`` token weights (0 on padding, which is therefore left out).

        Returns:
            The weighted sums of per-token cosines, float64 on the CPU.
        """
        start = time.perf_counter()
        hidden_size = block_inputs[0].shape[-1]
        flat_weight = weight.reshape(-1)
        real_positions = torch.nonzero(flat_weight > 0).flatten()
        per_chunk = max(1, SIMILARITY_CHUNK_ELEMENTS // (len(block_inputs) * hidden_size))
        sums = torch.zeros(len(block_inputs), len(block_inputs), dtype=torch.float64)
        for positions in real_positions.split(per_chunk):
            features = torch.stack(
                [
                    state.reshape(-1, hidden_size)[positions.to(state.device)].to(self.device).float()
                    for state in block_inputs
                ]
            )
            # LoRP's per-token L2 normalisation, eps included (a zero state contributes 0, not NaN).
            features = features / (features.norm(dim=-1, keepdim=True) + 1e-8)
            weighted = features * flat_weight[positions].to(features.dtype)[None, :, None]
            sums += torch.einsum("icd,jcd->ij", weighted, features).double().cpu()
        self.stats.similarity_seconds += time.perf_counter() - start
        return sums

    def _reference_for(self, batch_index: int):
        """``row -> dense log-probs [seq, vocab]`` of one batch (``kl`` only)."""
        stored = self._reference[batch_index]
        if stored is None:
            return None
        if self.cache_reference_logprobs:
            return lambda row: stored[row].to(self.device)

        def recompute(row: int) -> torch.Tensor:
            with torch.no_grad():
                return torch.log_softmax(self._head(stored[row].to(self.device)).float(), dim=-1)

        return recompute

    # ------------------------------------------------------------------------------------------ scoring

    def dense_loss(self) -> float:
        """The calibration loss of the dense model (``score(frozenset())``)."""
        return self.score(frozenset())

    def score(self, removed_blocks) -> float:
        """Calibration loss with ``removed_blocks`` skipped (lower is better), memoised by set.

        A set that a ranking query stopped early (its score a lower bound) is scored to the end here.

        Raises:
            UserError: an index out of range, a duplicate, or every block removed.
        """
        removed = validate_removed(removed_blocks, self.num_blocks)
        if not self.naive and removed in self._memo:
            self.stats.memo_hits += 1
            return self._memo[removed]
        start = time.perf_counter()
        with torch.no_grad():
            if self.naive:
                loss = self._naive_loss(removed)
                self.stats.evaluations += 1
            else:
                self._score_group([removed], remember=True)
                loss = self._memo[removed]
        self.stats.wall_seconds += time.perf_counter() - start
        return loss

    def score_many(self, removed_sets) -> list[float]:
        """The losses of several removal sets, equal to :meth:`score` of each.

        With shortcuts the sets not yet memoised run together, depth first through the trie of removal
        sets: a prefix of removed blocks several of them share is computed once per batch.

        Raises:
            UserError: an invalid removal set.
        """
        sets = [validate_removed(removed, self.num_blocks) for removed in removed_sets]
        if not self.shortcuts:
            return [self.score(removed) for removed in sets]
        start = time.perf_counter()
        pending = list(dict.fromkeys(removed for removed in sets if removed not in self._memo))
        self.stats.memo_hits += len(sets) - len(pending)
        with torch.no_grad():
            self._score_group(pending, remember=True)
        self.stats.wall_seconds += time.perf_counter() - start
        return [self._memo[removed] for removed in sets]

    def rank_lowest(self, removed_sets, keep: int, bases=()) -> list[tuple[float, bool]]:
        """Enough of each set's loss to tell the ``keep`` lowest: ``(loss, True)`` or ``(bound, False)``.

        Exact: a set answered by a bound has a loss above the ``keep``-th lowest, so it cannot be among the
        ``keep`` lowest (ties included); those are always answered with their values. Sets are scored by
        increasing single-block prior (summed over their blocks), ``keep`` at a time, and a set's scoring
        stops once its bound, the losses of its batches so far plus the objective's floor for the rest,
        exceeds the ``keep``-th lowest loss so far. Objectives without a floor (``task_margin``) and
        ``shortcuts=False`` score every set to the end.

        Args:
            removed_sets: the candidate removal sets.
            keep: how many lowest the caller needs (greedy 1, beam its width, one-shot M).
            bases: sets the candidates extend by one block; their boundaries are cached first, so that a
                candidate base ∪ {j} runs from block j.

        Returns:
            ``(loss or lower bound, exact)`` per set, in the order given.
        """
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise ValueError(f"keep must be a positive integer, got {keep!r}")
        sets = [validate_removed(removed, self.num_blocks) for removed in removed_sets]
        if not self.shortcuts:
            return [(self.score(removed), True) for removed in sets]
        start = time.perf_counter()
        with torch.no_grad():
            # Only worth its forward when some candidate is still unscored.
            if any(removed not in self._memo and removed not in self._bounds for removed in sets):
                for base in bases:
                    self._materialise(validate_removed(base, self.num_blocks))
            if self.loss_floor is None:
                pending = list(dict.fromkeys(removed for removed in sets if removed not in self._memo))
                self.stats.memo_hits += len(sets) - len(pending)
                self._score_group(pending)
            else:
                self._rank_by_prior(sets, keep)
        self.stats.wall_seconds += time.perf_counter() - start
        return [self._ranked(removed) for removed in sets]

    def rank_single_blocks(self, keep: int) -> list[tuple[float, bool]]:
        """The single-block prior as a ranking query (:meth:`rank_lowest` of the N one-block sets).

        All exact once :meth:`single_block_scores` has run.
        """
        if self._single_scores is not None:
            return [(float(loss), True) for loss in self._single_scores]
        return self.rank_lowest([frozenset({block}) for block in range(self.num_blocks)], keep)

    def lower_bound(self, removed_blocks) -> float | None:
        """The lower bound kept for a set whose scoring a ranking query stopped early; None for any other."""
        partial = self._bounds.get(validate_removed(removed_blocks, self.num_blocks))
        return None if partial is None else partial.lower_bound(self.num_samples, self.loss_floor)

    def _ranked(self, removed: frozenset[int]) -> tuple[float, bool]:
        if removed in self._memo:
            return self._memo[removed], True
        return self._bounds[removed].lower_bound(self.num_samples, self.loss_floor), False

    def _rank_by_prior(self, sets: list[frozenset[int]], keep: int) -> None:
        """:meth:`rank_lowest`'s scoring: best prior first, ``keep`` at a time, stopping hopeless sets."""
        prior = self._block_prior()
        ordered = sorted(
            dict.fromkeys(sets), key=lambda removed: (float(sum(prior[i] for i in removed)), sorted(removed))
        )
        lowest = LowestLosses(keep)
        pending = []
        for removed in ordered:
            if removed in self._memo:
                self.stats.memo_hits += 1
                lowest.add(self._memo[removed])
            else:
                pending.append(removed)
        for first in range(0, len(pending), keep):
            group = pending[first : first + keep]
            self._score_group(group, lowest.threshold)
            for removed in group:
                if removed in self._memo:
                    lowest.add(self._memo[removed])

    def _block_prior(self) -> np.ndarray:
        """Per block, what orders ranking queries: its single-block loss (or bound) once every block has
        one, else its Block Influence (free from the reference pass). Only the order depends on it."""
        singles = []
        for block in range(self.num_blocks):
            key = frozenset({block})
            if key in self._memo:
                singles.append(self._memo[key])
            elif key in self._bounds:
                singles.append(self._bounds[key].lower_bound(self.num_samples, self.loss_floor))
            else:
                return np.asarray(self._influence, dtype=np.float64)
        return np.asarray(singles, dtype=np.float64)

    def _score_group(
        self, group: list[frozenset[int]], threshold: float | None = None, remember: bool = False
    ) -> None:
        """Score ``group`` (sets not memoised) batch by batch, depth first through the trie.

        Completed sets go to the memo. With a ``threshold`` (a ranking query), a set whose lower bound
        exceeds it before its last batch stops there and goes to the bounds, partial losses kept, so
        that scoring it again resumes at its next batch. With ``remember``, the states the group computed
        become trie nodes (as many as the budget holds), for later sets sharing their prefixes.
        """
        resumed = {removed for removed in group if removed in self._bounds}
        partials = {removed: self._bounds.pop(removed, None) or PartialScore() for removed in group}
        prefixes = {tuple(sorted(removed)): removed for removed in group}
        stopped: set[frozenset[int]] = set()
        # Nodes are kept where the cache lives; copying every state off the device would cost more.
        nodes: dict[tuple[Prefix, int], dict[int, torch.Tensor]] | None = (
            {} if remember and self.shortcuts and self.cache_device == self.device else None
        )
        for step, batch_index in enumerate(self._batch_order):
            active = []
            for prefix, removed in prefixes.items():
                partial = partials[removed]
                if removed in stopped or partial.batches_done != step:
                    continue
                if threshold is not None and exceeds(
                    partial.lower_bound(self.num_samples, self.loss_floor), threshold
                ):
                    stopped.add(removed)
                    continue
                active.append(prefix)
            ordered = trie_order(active, self.num_blocks)
            for prefix, losses in zip(ordered, self._run_trie_batch(ordered, batch_index, nodes)):
                partials[prefixes[prefix]].losses[batch_index] = losses
        for removed in group:
            partial = partials[removed]
            if partial.batches_done == len(self.run_batches):
                self._memo[removed] = partial.value()
                self.stats.evaluations += 1
                self.stats.bounds_completed += removed in resumed
            else:
                self._bounds[removed] = partial
                self.stats.stopped_early += 1
        for (prefix, boundary), states in (nodes or {}).items():
            if len(states) == len(self.run_batches):  # batches run in _batch_order; nodes list them by index
                self._prefix.remember(prefix, boundary, [states[index] for index in range(len(states))])

    def _run_trie_batch(
        self, ordered: list[Prefix], batch_index: int, nodes: dict | None = None
    ) -> list[torch.Tensor]:
        """Per-sample losses of one batch for each set of ``ordered`` (a :func:`trie_order`).

        Each set starts from the deepest state on its path: a cached node, or a state an earlier set of
        the group left on the stack at a boundary where this one branches off. The stack only ever holds
        states of the current set's path (≤ N states of one batch). ``nodes``, when given, collects the
        states each set computed, ``(set, boundary) -> {batch index: state}``, up to the node capacity.
        """
        run = self.run_batches[batch_index]
        reference = self._reference_for(batch_index)
        points = branch_points(ordered, self.num_blocks)
        stack: list[tuple[int, torch.Tensor]] = []
        results = []
        for position, removed in enumerate(ordered):
            if position:
                shared = min(set(removed) ^ set(ordered[position - 1]), default=self.num_blocks)
                while stack and stack[-1][0] > shared:
                    stack.pop()
            start, states = self._prefix.start(removed)
            if stack and stack[-1][0] >= start:
                start, hidden = stack[-1]
            else:
                hidden = states[batch_index].to(self.device)
            keep_at = {point for point in points[position] if point > start}
            hidden = self._run_path(hidden, start, removed, batch_index, keep_at, stack, nodes)
            results.append(
                self.objective.loss(run.calibration, run.objective_hidden(hidden), self._head, reference)
            )
        return results

    def _run_path(
        self,
        hidden: torch.Tensor,
        start: int,
        removed: Prefix,
        batch_index: int,
        keep_at: set[int],
        stack: list[tuple[int, torch.Tensor]],
        nodes: dict | None,
    ) -> torch.Tensor:
        """Run the blocks of one batch from boundary ``start`` to the end with ``removed`` skipped.

        The states entering the blocks in ``keep_at`` are pushed on ``stack``; with ``nodes``, the state at
        each boundary past ``start`` (one per distinct state) is collected while the capacity allows.
        """
        removed_set = set(removed)
        kwargs = self._prepared[batch_index]
        blocks = 0
        for index in range(start, self.num_blocks):
            if index in keep_at:
                stack.append((index, hidden))
            if (
                nodes is not None
                and index > start
                and index - 1 not in removed_set
                and ((removed, index) in nodes or len(nodes) < self._prefix.capacity)
            ):
                nodes.setdefault((removed, index), {})[batch_index] = hidden.to(self.cache_device)
            if index in removed_set:
                continue
            hidden = self.stack.blocks[index](hidden, **kwargs[index])
            blocks += 1
        self._count_blocks(self.run_batches[batch_index], blocks)
        return hidden

    def _materialise(self, base: frozenset[int]) -> None:
        """Cache the states of ``base`` at its boundaries past its deepest cached node, as many as the
        budget holds (evenly spaced when not all), so that a candidate base ∪ {j} starts at block j."""
        if not base or self._prefix.capacity == 0:
            return
        removed = tuple(sorted(base))
        start, states = self._prefix.start(removed)
        # Past a removed block the state is the one before it: no node of its own.
        wanted = spaced(
            [k for k in range(start + 1, self.num_blocks) if k - 1 not in base], self._prefix.capacity
        )
        if not wanted:
            return
        nodes: dict[int, list[torch.Tensor]] = {boundary: [] for boundary in wanted}
        for batch_index, run in enumerate(self.run_batches):
            hidden = states[batch_index].to(self.device)
            blocks = 0
            for index in range(start, wanted[-1]):
                if index not in base:
                    hidden = self.stack.blocks[index](hidden, **self._prepared[batch_index][index])
                    blocks += 1
                if index + 1 in nodes:
                    nodes[index + 1].append(hidden.to(self.cache_device))
            self._count_blocks(run, blocks)
        for boundary in wanted:
            self._prefix.remember(removed, boundary, nodes[boundary])

    def _naive_loss(self, removed: frozenset[int]) -> float:
        losses = [self._naive_batch_losses(removed, index) for index in range(len(self.batches))]
        return float(torch.cat(losses).double().mean())

    def _naive_batch_losses(self, removed: frozenset[int], batch_index: int) -> torch.Tensor:
        """Per-sample losses of one calibration batch by a full forward (naive mode)."""
        batch = self.batches[batch_index]
        logits = self.stack.forward(batch.input_ids, removed)
        self._count_blocks(batch, self.num_blocks - len(removed))
        self.stats.head_positions += batch.input_ids.numel()
        return self.objective.loss(batch, logits, lambda x: x, self._reference_for(batch_index))

    # ---------------------------------------------------------------------------- minibatch scores

    def score_samples(self, removed_blocks, samples) -> float:
        """Mean per-sample calibration loss of ``removed_blocks`` over the calibration samples ``samples``.

        EvoPress's minibatch fitness (:mod:`pruning.search.evolution`): a cheap, noisier estimate of
        :meth:`score` from a few samples. Exactly :meth:`score` when ``samples`` names every sample.

        Args:
            removed_blocks: the removal set.
            samples: indices in ``0..num_samples-1`` (text windows or questions, in calibration order).

        Returns:
            The mean of the objective's per-sample losses over ``samples``.

        Raises:
            UserError: an invalid removal set. ValueError: an empty, out-of-range or repeated sample index.
        """
        return self.score_samples_many([removed_blocks], samples)[0]

    def score_samples_many(self, removed_sets, samples) -> list[float]:
        """:meth:`score_samples` of several sets on the same samples.

        Only the calibration batches holding ``samples`` run, each whole (a batch's sequences are one
        forward), and with shortcuts depth first through the trie of the sets, as :meth:`score_many`. Every
        per-sample loss a set's batches gave is kept (and saved with the memo), so a set scored again on
        another minibatch (EvoPress's parents, its survivors) runs only the batches it has not run yet.

        Returns:
            One loss per set, in the order given.
        """
        sets = [validate_removed(removed, self.num_blocks) for removed in removed_sets]
        indices = self._checked_samples(samples)
        if len(indices) == self.num_samples:
            return self.score_many(sets)  # every sample: the full loss, memoised
        start = time.perf_counter()
        ranges = self._sample_ranges()
        with torch.no_grad():
            for batch_index, batch_samples in enumerate(ranges):
                wanted = [index for index in indices if index in batch_samples]
                missing = [removed for removed in sets if not self._knows(removed, wanted)]
                if missing:
                    self._run_batch_for_samples(list(dict.fromkeys(missing)), batch_index, batch_samples)
        self.stats.wall_seconds += time.perf_counter() - start
        return [float(np.mean([self._sample_losses[removed][i] for i in indices])) for removed in sets]

    def _checked_samples(self, samples) -> list[int]:
        """The sample indices, sorted; a ValueError for none, a repeat or one out of range."""
        indices = sorted(int(sample) for sample in samples)
        if not indices:
            raise ValueError("score_samples needs at least one sample")
        if len(set(indices)) != len(indices):
            raise ValueError(f"repeated sample indices in {indices}")
        if not 0 <= indices[0] <= indices[-1] < self.num_samples:
            raise ValueError(f"sample indices must be in 0..{self.num_samples - 1}, got {indices}")
        return indices

    def _sample_ranges(self) -> list[range]:
        """The calibration sample indices each run batch holds (samples in calibration order)."""
        ranges, first = [], 0
        for run in self.run_batches:
            ranges.append(range(first, first + run.calibration.num_samples))
            first += run.calibration.num_samples
        return ranges

    def _knows(self, removed: frozenset[int], samples: list[int]) -> bool:
        known = self._sample_losses.get(removed, {})
        return all(index in known for index in samples)

    def _run_batch_for_samples(self, sets: list[frozenset[int]], batch_index: int, samples: range) -> None:
        """Per-sample losses of one batch for each of ``sets``, into ``_sample_losses``."""
        pending = []
        for removed in sets:
            partial = self._bounds.get(removed)
            if partial is not None and batch_index in partial.losses:  # a ranking query ran this batch
                self._keep_sample_losses(removed, samples, partial.losses[batch_index])
            else:
                pending.append(removed)
        if self.naive:
            computed = [self._naive_batch_losses(removed, batch_index) for removed in pending]
        else:
            prefixes = {tuple(sorted(removed)): removed for removed in pending}
            # One set at a time without shortcuts, as score() runs them; a trie group with them.
            if self.shortcuts:
                groups = [trie_order(list(prefixes), self.num_blocks)]
            else:
                groups = [[prefix] for prefix in prefixes]
            pending, computed = [], []
            for ordered in groups:
                pending += [prefixes[prefix] for prefix in ordered]
                computed += self._run_trie_batch(ordered, batch_index)
        for removed, losses in zip(pending, computed, strict=True):
            self._keep_sample_losses(removed, samples, losses)

    def _keep_sample_losses(self, removed: frozenset[int], samples: range, losses: torch.Tensor) -> None:
        known = self._sample_losses.setdefault(removed, {})
        known.update(zip(samples, losses.double().cpu().tolist(), strict=True))

    # ------------------------------------------------------------------------------- what searches need

    def single_block_scores(self) -> np.ndarray:
        """``[N]`` losses with exactly block i removed (the prior of one-shot, GA and BO); computed once."""
        if self._single_scores is None:
            indices = tqdm(
                range(self.num_blocks), desc="single-block scores", unit="block", disable=not self.progress
            )
            self._single_scores = np.array([self.score(frozenset({index})) for index in indices])
        return self._single_scores.copy()

    def block_influence(self) -> np.ndarray:
        """``[N]`` ShortGPT Block Influence 1 − mean_t cos(h_in, h_out), over every real calibration token."""
        if self._influence is None:  # naive mode skips the dense pass until something needs it
            start = time.perf_counter()
            self._dense_pass()
            self.stats.wall_seconds += time.perf_counter() - start
        return self._influence.copy()

    def block_input_similarity(self) -> np.ndarray:
        """``[N, N]`` S[i, j] = mean over real calibration tokens of cos(input of block i, input of block j).

        LoRP's similarity matrix (and LLM-Streamline's criterion), from the dense reference pass: per-token
        L2-normalised block inputs (``hidden_states[0..N-1]``; the final output is not used), weighted per
        token as Block Influence is (padding left out, a shared prompt token once per choice), computed in
        float32 and accumulated in float64; symmetric with a unit diagonal.
        """
        if self._similarity is None:  # naive mode skips the dense pass until something needs it
            start = time.perf_counter()
            self._dense_pass()
            self.stats.wall_seconds += time.perf_counter() - start
        return self._similarity.copy()

    def residual_gradients(self) -> np.ndarray:
        """``[samples, N]`` per-sample gradients dL_s/dα_i at α = 1, block output h + α_i·(block(h) − h).

        CBO's matrix A. Samples are text windows or multiple-choice items. For ``kl`` every entry is 0: the
        dense model is the minimum of its own KL, so its gradient vanishes there.
        """
        if self._gradients is not None:
            return self._gradients.copy()
        start = time.perf_counter()
        rows = []
        for batch_index, run in enumerate(
            tqdm(self.run_batches, desc="residual gradients", unit="batch", disable=not self.progress)
        ):
            batch = run.calibration
            with torch.no_grad():
                prepared = self.stack.prepare(run.input_ids, run.attention_mask, run.position_ids)
            alphas = torch.ones(
                batch.num_samples,
                self.num_blocks,
                device=self.device,
                dtype=prepared.hidden.dtype,
                requires_grad=True,
            )
            row_alphas = alphas[run.sample_of_row]
            with torch.enable_grad():
                hidden = prepared.hidden
                for index, block in enumerate(self.stack.blocks):
                    output = block(hidden, **prepared.block_kwargs[index])
                    hidden = hidden + row_alphas[:, index, None, None] * (output - hidden)
                self._count_blocks(run, self.num_blocks)
                losses = self.objective.loss(
                    batch, run.objective_hidden(hidden), self._head, self._reference_for(batch_index)
                )
                # Samples are independent in a batch, so the gradient of the sum row s is dL_s/dα.
                (gradient,) = torch.autograd.grad(losses.sum(), alphas)
            rows.append(gradient.double().cpu())
        self._gradients = torch.cat(rows).numpy()
        self.stats.wall_seconds += time.perf_counter() - start
        return self._gradients.copy()

    # ----------------------------------------------------------------------------------------- the memo

    def _memo_key(self) -> dict:
        return {"model": self.model_id, "dtype": self.dtype, "config": asdict(self.config)}

    def save_memo(self, path: str | Path) -> Path:
        """Write every score so far as JSON (atomically), with the model and configuration they belong to."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "format": MEMO_FORMAT,
            **self._memo_key(),
            "scores": [
                {"removed": sorted(removed), "loss": loss}
                for removed, loss in sorted(self._memo.items(), key=lambda kv: sorted(kv[0]))
            ],
            # Lower bounds of sets a ranking query stopped early: never values; a resumed ranking reuses them.
            "bounds": [
                {
                    "removed": sorted(removed),
                    "lower_bound": partial.lower_bound(self.num_samples, self.loss_floor),
                }
                for removed, partial in sorted(self._bounds.items(), key=lambda kv: sorted(kv[0]))
            ],
            # Per-sample losses of minibatch scores (score_samples), [[sample, loss], ...]: not values either.
            "sample_losses": [
                {"removed": sorted(removed), "losses": sorted(known.items())}
                for removed, known in sorted(self._sample_losses.items(), key=lambda kv: sorted(kv[0]))
            ],
        }
        write_text_atomically(path, json.dumps(payload, indent=1))
        return path

    def load_memo(self, path: str | Path) -> int:
        """Add the scores of a :meth:`save_memo` file; returns how many were read (its bounds not counted).

        Raises:
            UserError: the file is missing, malformed, or belongs to another model or configuration.
        """
        path = Path(path)
        try:
            payload = json.loads(path.read_text())
        except FileNotFoundError:
            raise UserError(f"memo file {str(path)!r} does not exist") from None
        except json.JSONDecodeError as error:
            raise UserError(f"memo file {str(path)!r} is not valid JSON ({error.msg})") from None
        if not isinstance(payload, dict) or payload.get("format") != MEMO_FORMAT:
            raise UserError(f"{str(path)!r} is not a depthprune score memo")
        expected = self._memo_key()
        for key, value in expected.items():
            if payload.get(key) != value:
                raise UserError(f"memo {str(path)!r} was made for {key} {payload.get(key)!r}, not {value!r}")
        for entry in payload["scores"]:
            self._memo[validate_removed(entry["removed"], self.num_blocks)] = float(entry["loss"])
        for entry in payload.get("bounds", []):
            removed = validate_removed(entry["removed"], self.num_blocks)
            if removed not in self._memo and removed not in self._bounds:
                self._bounds[removed] = PartialScore(recorded_bound=float(entry["lower_bound"]))
        for entry in payload.get("sample_losses", []):
            known = self._sample_losses.setdefault(validate_removed(entry["removed"], self.num_blocks), {})
            known.update((int(sample), float(loss)) for sample, loss in entry["losses"])
        return len(payload["scores"])

    def journal_memo(self, path: str | Path):
        """Add the scores a killed run journalled at ``path``, and journal every new score there as it is
        memoised (values only, never bounds; :mod:`pruning.calibration.memo_journal`).

        Returns:
            The :class:`~pruning.calibration.memo_journal.MemoJournal`: compact it after :meth:`save_memo`.
        """
        from pruning.calibration.memo_journal import journalled_memo

        self._memo, journal = journalled_memo(path, self._memo_key(), self._memo, self.num_blocks)
        for removed, _ in journal.replayed:
            self._bounds.pop(frozenset(removed), None)  # a value read back supersedes a bound
        return journal


def build_evaluator(
    model: str,
    config: CalibrationConfig,
    *,
    dtype: str = "float32",
    device: str = "cpu",
    memory_budget_gb: float | None = None,
    naive: bool = False,
    progress: bool = True,
    batch_size: int = 8,
    split: str = "calibration",
    pack_choices: bool = True,
    shortcuts: bool = True,
) -> SubsetEvaluator:
    """Load a model and its calibration data, and run the dense reference pass.

    Every input is checked (objective and data kind, the data itself, the model's config) before the model's
    weights are loaded.

    Args:
        model: hub id or local directory of a supported causal LM.
        config: the calibration configuration.
        dtype: torch dtype the model runs in.
        device: torch device.
        memory_budget_gb: how much memory the boundary cache (and the KL reference) may take on ``device``;
            default half of the free GPU memory, or a quarter of the available host memory on CPU.
        naive: score by a full forward per candidate with no cache or memo (for benchmarks).
        progress: show progress bars.
        batch_size: sequences per forward (packed: questions per forward).
        split: ``calibration`` (default) or ``test`` split of the data source.
        pack_choices: run each question's choices as one sequence sharing the prompt (exact; ignored for
            text objectives, in naive mode and for attention implementations without 4-D masks).
        shortcuts: cache the boundaries of the sets searches extend, share prefixes within a group of
            sets, and stop ranking candidates at a lower bound (exact; ``False`` scores as before them).

    Returns:
        A ready :class:`SubsetEvaluator`.
    """
    from transformers import AutoTokenizer

    from pruning.calibration.data import load_samples

    if not isinstance(config, CalibrationConfig):
        raise TypeError("config must be a CalibrationConfig")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise UserError(f"batch size must be a positive integer, got {batch_size!r}")
    if memory_budget_gb is not None and memory_budget_gb < 0:
        raise UserError(f"memory budget must be >= 0 GiB, got {memory_budget_gb}")
    started = time.perf_counter()
    load_config(model)
    tokenizer = AutoTokenizer.from_pretrained(model)
    samples = load_samples(config.data, tokenizer, config.samples, config.seq_len, config.seed, split)
    batches = make_batches(samples, tokenizer, config.seq_len, batch_size)
    causal_lm, _ = load_model(model, dtype=dtype, device=device)
    evaluator = SubsetEvaluator(
        BlockStack(causal_lm),
        config,
        batches,
        model_id=str(model),
        dtype=dtype,
        memory_budget_gb=memory_budget_gb,
        naive=naive,
        progress=progress,
        pack_choices=pack_choices,
        packed_rows=batch_size,
        shortcuts=shortcuts,
    )
    evaluator.stats.setup_seconds = time.perf_counter() - started
    return evaluator


def check_budget(budget: int, num_blocks: int) -> None:
    """A removal budget M must leave at least one of the N blocks: 1 <= M < N."""
    if not isinstance(budget, int) or not 0 < budget < num_blocks:
        raise UserError(
            f"budget M={budget} must be between 1 and {num_blocks - 1}: the model has {num_blocks} blocks"
        )


def benchmark_sets(
    num_blocks: int, budget: int = 4, random_sets: int = 100, seed: int = 0
) -> list[frozenset[int]]:
    """The benchmark workload: every single-block removal, then ``random_sets`` random M-block sets."""
    import random

    check_budget(budget, num_blocks)
    if random_sets < 0:
        raise UserError(f"the number of random sets must be >= 0, got {random_sets}")
    rng = random.Random(seed)
    singles = [frozenset({index}) for index in range(num_blocks)]
    return singles + [frozenset(rng.sample(range(num_blocks), budget)) for _ in range(random_sets)]


def _score_workload(
    model: str,
    config: CalibrationConfig,
    side: str,
    round_label: str,
    workload: dict,
    build_options: dict,
) -> tuple[SubsetEvaluator, list[frozenset[int]], np.ndarray]:
    """One benchmark round of one side (``fast`` or ``naive``) from a freshly built evaluator.

    Args:
        model: hub id or local directory.
        config: the calibration configuration.
        side: ``fast`` or ``naive``.
        round_label: ``"i/n"`` for the progress bar.
        workload: ``budget``, ``random_sets`` and ``seed`` of :func:`benchmark_sets`, and the fast side's
            ``memory_budget_gb``.
        build_options: the other keyword arguments of :func:`build_evaluator`.

    Returns:
        The evaluator (its stats hold the round's cost), the removal sets and their scores.
    """
    naive = side == "naive"
    evaluator = build_evaluator(
        model,
        config,
        naive=naive,
        memory_budget_gb=None if naive else workload["memory_budget_gb"],
        **build_options,
    )
    sets = benchmark_sets(evaluator.num_blocks, workload["budget"], workload["random_sets"], workload["seed"])
    scored = [
        evaluator.score(removed)
        for removed in tqdm(
            sets,
            desc=f"{side} scoring ({round_label})",
            unit="set",
            disable=not build_options["progress"],
        )
    ]
    return evaluator, sets, np.array(scored)


def _comparison_record(
    model: str,
    config: CalibrationConfig,
    evaluators: dict[str, SubsetEvaluator],
    sets: list[frozenset[int]],
    seconds: dict[str, list[float]],
    difference: float,
    settings: dict,
) -> dict:
    """The JSON-ready result of :func:`compare_with_naive` from the last evaluator of each side."""
    fast, naive = evaluators["fast"], evaluators["naive"]
    fast_seconds, naive_seconds = float(np.median(seconds["fast"])), float(np.median(seconds["naive"]))
    return {
        "model": str(model),
        "calibration": asdict(config),
        "num_blocks": fast.num_blocks,
        "sets": len(sets),
        "distinct_sets": len(set(sets)),
        "budget": settings["budget"],
        "sequences": sum(batch.input_ids.shape[0] for batch in fast.batches),
        "packed_sequences": sum(run.input_ids.shape[0] for run in fast.run_batches),
        "packed": fast.packed,
        "batch_size": settings["batch_size"],
        "dtype": settings["dtype"],
        "device": str(fast.device),
        "threads": torch.get_num_threads(),
        "cached_boundaries": fast.boundaries,
        "repeats": settings["repeats"],
        "fast_seconds": round(fast_seconds, 3),
        "fast_reference_pass_seconds": round(fast.stats.reference_seconds, 3),
        "naive_seconds": round(naive_seconds, 3),
        "speedup": round(naive_seconds / fast_seconds, 3) if fast_seconds else None,
        "fast_seconds_each": [round(value, 3) for value in seconds["fast"]],
        "naive_seconds_each": [round(value, 3) for value in seconds["naive"]],
        "fast_block_forwards": fast.stats.block_forwards,
        "naive_block_forwards": naive.stats.block_forwards,
        "fast_tokens": fast.stats.tokens,
        "naive_tokens": naive.stats.tokens,
        "fast_head_positions": fast.stats.head_positions,
        "naive_head_positions": naive.stats.head_positions,
        "fast_memo_hits": fast.stats.memo_hits,
        "max_abs_difference": difference,
        "tolerance": settings["tolerance"],
        "agree": difference <= settings["tolerance"],
        "fast_stats": asdict(fast.stats),
        "naive_stats": asdict(naive.stats),
    }


def compare_with_naive(
    model: str,
    config: CalibrationConfig,
    *,
    budget: int = 4,
    random_sets: int = 100,
    seed: int = 0,
    batch_size: int = 16,
    dtype: str = "float32",
    device: str = "cpu",
    memory_budget_gb: float | None = None,
    tolerance: float = 1e-5,
    progress: bool = True,
    repeats: int = 1,
    pack_choices: bool = True,
) -> dict:
    """Score the benchmark workload with the fast evaluator and with naive full forwards.

    The fast side's time includes its dense reference pass (the price of the cache); model loading is
    excluded from both. With ``repeats`` > 1 both sides run that many times, interleaved (fast, naive, then
    naive, fast, ...: drift of a shared machine hits both), each time from a freshly built evaluator (empty
    memo, its own reference pass); times are the medians and ``speedup`` their ratio.

    Returns:
        One JSON-ready dict: wall times, block-forward and token counts, ``speedup``, ``agree`` and the
        largest score difference.
    """
    benchmark_sets(load_config(model).num_hidden_layers, budget, random_sets, seed)  # bad input: fail early
    if not isinstance(repeats, int) or repeats < 1:
        raise UserError(f"repeats must be a positive integer, got {repeats!r}")
    workload = {
        "budget": budget,
        "random_sets": random_sets,
        "seed": seed,
        "memory_budget_gb": memory_budget_gb,
    }
    build_options = {
        "dtype": dtype,
        "device": device,
        "progress": progress,
        "batch_size": batch_size,
        "pack_choices": pack_choices,
    }
    seconds: dict[str, list[float]] = {"fast": [], "naive": []}
    scores: dict[str, np.ndarray] = {}
    evaluators: dict[str, SubsetEvaluator] = {}
    difference = 0.0
    for repeat in range(repeats):
        for side in ("fast", "naive") if repeat % 2 == 0 else ("naive", "fast"):
            evaluator, sets, scored = _score_workload(
                model, config, side, f"{repeat + 1}/{repeats}", workload, build_options
            )
            if side in scores:  # every repeat must give the very same scores
                difference = max(difference, float(np.max(np.abs(scored - scores[side]))))
            scores[side] = scored
            seconds[side].append(evaluator.stats.wall_seconds + evaluator.stats.reference_seconds)
            evaluators[side] = evaluator
    difference = max(difference, float(np.max(np.abs(scores["fast"] - scores["naive"]))))
    settings = {
        "budget": budget,
        "batch_size": batch_size,
        "dtype": dtype,
        "repeats": repeats,
        "tolerance": tolerance,
    }
    return _comparison_record(model, config, evaluators, sets, seconds, difference, settings)
