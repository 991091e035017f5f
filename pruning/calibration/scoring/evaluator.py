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
  JSON so that an interrupted search resumes without re-scoring (:mod:`.memo`).
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

``naive=True`` is the SLEB way, kept for the benchmark (:mod:`.bench`): a full forward per candidate (every
block, the LM head on every position, one sequence per choice), no boundary cache, no memo and no packing.

The evaluator also provides what some searches need besides scores: single-block scores (the prior),
per-sample residual-branch gradients (CBO), ShortGPT's Block Influence, and the block-input similarity
matrix of LoRP and LLM-Streamline. The last two come from the dense reference pass itself (no extra forward).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from depthprune.core.objectives import MULTIPLE_CHOICE, Objective
from pruning.calibration.config import CalibrationConfig
from pruning.calibration.objectives import configured_loss, get_objective
from pruning.calibration.objectives.batches import CalibrationBatch, chunked
from pruning.calibration.scoring import memo
from pruning.calibration.scoring.fusion import fused_blocks as fuse
from pruning.calibration.scoring.packing import RunBatch, as_run_batch, pack_choice_batches
from pruning.calibration.scoring.shortcuts import (
    LowestLosses,
    PartialScore,
    Prefix,
    PrefixStates,
    available_memory_bytes,
    branch_points,
    device_free_bytes,
    exceeds,
    plan_boundaries,
    spaced,
    trie_order,
)
from pruning.calibration.scoring.statistics import EvaluatorStats, input_similarity_sums
from pruning.model.blocks import BlockStack, validate_removed


class SubsetEvaluator:
    """Scores removal sets under one calibration configuration (implements ``SubsetObjective``).

    Build it with :func:`~pruning.calibration.scoring.build.build_evaluator`. ``batches`` are the calibration
    batches (one sequence per text window or per choice); ``run_batches`` are what the blocks run (choices
    packed per question unless ``naive``, ``pack_choices=False`` or an attention implementation without 4-D
    masks, with up to ``packed_rows`` questions per forward: default, as many as the largest batch has
    sequences). ``fused_blocks`` runs the blocks through one compiled forward (:mod:`.fusion`, CUDA only).
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
        fused_blocks: bool | str = False,
    ):
        self.stack = stack
        self.config = config
        self.model_id = model_id
        self.dtype = dtype
        self.naive = naive
        self.shortcuts = shortcuts and not naive
        self.progress = progress
        self.objective = get_objective(config.objective)
        """The calibration objective's facts (:class:`~depthprune.core.objectives.Objective`)."""
        self.loss = configured_loss(config)
        """Its loss with the configuration's parameters, ``loss(batch, hidden, head, reference) -> per-sample
        losses``."""
        self.loss_floor = config.loss_floor
        self.needs_reference = config.needs_reference
        """Whether scoring compares against the dense model (``kl``, ``--kl-weight``)."""
        self.num_blocks = stack.num_blocks
        self.device = stack.device
        # What scoring calls per block: the model's own forwards, or one compiled forward all blocks share.
        self.blocks = fuse(stack.blocks, self.device, fused_blocks) if fused_blocks else stack.blocks
        self.batches = [batch.to(self.device) for batch in batches]
        self.packed = (
            pack_choices
            and not naive
            and self.objective.data_kind == MULTIPLE_CHOICE
            and stack.supports_segment_masks
            # KL over prompt and answer positions reads every position of every choice sequence
            and not config.kl_weight
        )
        if self.packed:
            rows = packed_rows or max(batch.input_ids.shape[0] for batch in batches)
            runs = pack_choice_batches([batch.to("cpu") for batch in batches], stack, rows)
        else:
            runs = [as_run_batch(batch) for batch in batches]
        self.run_batches: list[RunBatch] = [run.to(self.device) for run in runs]
        self.num_samples = sum(batch.num_samples for batch in batches)
        self.stats = EvaluatorStats()
        self.truncated_items = 0
        """Multiple-choice items cut to ``seq_len`` (``--truncate``; set by ``build_evaluator``)."""
        self.tokenizer = None
        """The model's tokenizer (set by ``build_evaluator``): held-out scoring draws more data with it."""
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
        if not naive or self.needs_reference:
            # naive mode caches nothing but the KL reference (part of that objective's definition).
            self._dense_pass()
        self._prefix = PrefixStates(self._states, self.boundaries, self.num_blocks, self.prefix_capacity)

    @property
    def search_state_bytes_most(self) -> int:
        """The most bytes the searches' states (trie nodes beyond the dense boundary cache) held at once."""
        return self._prefix.most_bytes_held

    @property
    def calibration_objective(self) -> Objective:
        """The facts of the objective it scores: what searches may ask instead of comparing names."""
        return self.objective

    # ------------------------------------------------------------------------------------------ set-up

    def _plan_cache(self, budget_bytes: float | None) -> None:
        """Decide where and which boundary states (and the KL reference) are cached."""
        hidden_size = self.stack.config.hidden_size
        element = torch.empty((), dtype=self.stack.lm_head.weight.dtype).element_size()
        positions = sum(run.input_ids.numel() for run in self.run_batches)
        per_boundary = positions * hidden_size * element
        on_gpu = self.device.type != "cpu"
        if budget_bytes is None:
            budget_bytes = (0.5 if on_gpu else 0.25) * device_free_bytes(self.device)
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
            self.needs_reference and self.cache_bytes + reference_bytes <= budget_bytes
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
                for index, block in enumerate(self.blocks):
                    if index in self.boundaries:
                        states[index] = hidden.to(self.cache_device)
                    # Inputs the cache does not keep are held for this batch only, where the cache lives.
                    block_inputs.append(states[index] if index in states else hidden.to(self.cache_device))
                    hidden = self.stack.to_block_device(index, hidden)
                    output = block(hidden, **prepared.block_kwargs[index])
                    cosine = torch.nn.functional.cosine_similarity(hidden.float(), output.float(), dim=-1)
                    influence[index] += ((1 - cosine).double() * weight).sum().cpu()
                    hidden = output
                similarity_start = time.perf_counter()
                similarity += input_similarity_sums(block_inputs, weight, self.device)
                self.stats.similarity_seconds += time.perf_counter() - similarity_start
                del block_inputs
                self._count_blocks(run, self.num_blocks)
                influence_tokens += float(weight.sum())
                self._reference.append(self._dense_reference(batch, hidden) if self.needs_reference else None)
                if not self.naive:
                    self._prepared.append(prepared.block_kwargs)
                    self._states.append(states)
                    # An objective 0 at the dense model by definition (KL to itself) needs no head call; a
                    # --kl-weight term is 0 there too, so only the loss it is added to runs.
                    losses.append(
                        torch.zeros(batch.num_samples)
                        if self.objective.zero_loss_at_dense
                        else configured_loss(self.config, with_kl=False)(
                            batch,
                            run.objective_hidden(hidden),
                            self._head,
                            self._reference_for(len(self._reference) - 1)
                            if self.objective.needs_reference
                            else None,
                        )
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

    def _dense_reference(self, batch: CalibrationBatch, hidden: torch.Tensor) -> list[torch.Tensor]:
        """Per sequence, what the KL reference keeps of the dense pass, on its real positions only: the
        log-probabilities (in LM-head chunks) when they fit the budget, else the final hidden states."""
        lengths = batch.token_mask.sum(dim=1).tolist()
        if not self.cache_reference_logprobs:
            return [hidden[row, :length].to(self.cache_device) for row, length in enumerate(lengths)]
        return [
            self._dense_logprobs(hidden[row, :length]).to(self.cache_device)
            for row, length in enumerate(lengths)
        ]

    def _dense_logprobs(self, hidden: torch.Tensor) -> torch.Tensor:
        pieces = [torch.log_softmax(self._head(chunk).float(), dim=-1) for _, chunk in chunked(hidden)]
        return torch.cat(pieces)

    def _reference_for(self, batch_index: int):
        """``row -> dense log-probs [real positions, vocab]`` of one batch (``kl``, ``--kl-weight``)."""
        stored = self._reference[batch_index]
        if stored is None:
            return None
        if self.cache_reference_logprobs:
            return lambda row: stored[row].to(self.device)

        def recompute(row: int) -> torch.Tensor:
            with torch.no_grad():
                return self._dense_logprobs(stored[row].to(self.device))

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
                bases = [validate_removed(base, self.num_blocks) for base in bases]
                self._prefix.forget_bases_off([tuple(sorted(base)) for base in bases])
                for base in bases:
                    self._materialise(base)
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
            results.append(self.loss(run.calibration, run.objective_hidden(hidden), self._head, reference))
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
            hidden = self.blocks[index](self.stack.to_block_device(index, hidden), **kwargs[index])
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
                    hidden = self.stack.to_block_device(index, hidden)
                    hidden = self.blocks[index](hidden, **self._prepared[batch_index][index])
                    blocks += 1
                if index + 1 in nodes:
                    nodes[index + 1].append(hidden.to(self.cache_device))
            self._count_blocks(run, blocks)
        for boundary in wanted:
            self._prefix.remember(removed, boundary, nodes[boundary], base=True)

    def _naive_loss(self, removed: frozenset[int]) -> float:
        losses = [self._naive_batch_losses(removed, index) for index in range(len(self.batches))]
        return float(torch.cat(losses).double().mean())

    def _naive_batch_losses(self, removed: frozenset[int], batch_index: int) -> torch.Tensor:
        """Per-sample losses of one calibration batch by a full forward (naive mode)."""
        batch = self.batches[batch_index]
        logits = self.stack.forward(batch.input_ids, removed)
        self._count_blocks(batch, self.num_blocks - len(removed))
        self.stats.head_positions += batch.input_ids.numel()
        return self.loss(batch, logits, lambda x: x, self._reference_for(batch_index))

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
                    hidden = self.stack.to_block_device(index, hidden)
                    output = block(hidden, **prepared.block_kwargs[index])
                    alpha = row_alphas[:, index, None, None].to(hidden.device)
                    hidden = hidden + alpha * (output - hidden)
                self._count_blocks(run, self.num_blocks)
                losses = self.loss(
                    batch, run.objective_hidden(hidden), self._head, self._reference_for(batch_index)
                )
                # Samples are independent in a batch, so the gradient of the sum row s is dL_s/dα.
                (gradient,) = torch.autograd.grad(losses.sum(), alphas)
            rows.append(gradient.double().cpu())
        self._gradients = torch.cat(rows).numpy()
        self.stats.wall_seconds += time.perf_counter() - start
        return self._gradients.copy()

    # ----------------------------------------------------------------------------------------- the memo

    def save_memo(self, path: str | Path) -> Path:
        """Write every score so far as JSON (atomically), with the model and configuration they belong to
        (:func:`~pruning.calibration.scoring.memo.save_memo`)."""
        return memo.save_memo(self, path)

    def load_memo(self, path: str | Path) -> int:
        """Add the scores of a :meth:`save_memo` file; returns how many were read (its bounds not counted).

        Raises:
            UserError: the file is missing, malformed, or belongs to another model or configuration.
        """
        return memo.load_memo(self, path)

    def journal_memo(self, path: str | Path) -> memo.MemoJournal:
        """Add the scores a killed run journalled at ``path``, and journal every new score there as it is
        memoised (values only, never bounds; :mod:`pruning.calibration.scoring.memo`).

        Returns:
            The :class:`~pruning.calibration.scoring.memo.MemoJournal`: compact it after :meth:`save_memo`.
        """
        return memo.journal_memo(self, path)
