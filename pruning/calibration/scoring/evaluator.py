"""The fast subset evaluator: ``score(removed_blocks) -> calibration loss``, what every search calls.

Exact — a score equals the calibration loss of the pruned checkpoint (the dense model run with those
blocks skipped) — and much cheaper than a full forward per candidate. :class:`SubsetEvaluator` is the face
searches see; the work is done by its collaborators, one module each:

* **Boundary cache** (:mod:`.dense_pass`). One dense pass at start-up stores the hidden state entering each
  block, where the memory budget allows, so a candidate runs only the kept blocks from the nearest cached
  boundary at or before its first removed block. The same pass gives Block Influence, the block-input
  similarity of LoRP and LLM-Streamline, the KL reference and the dense loss.
* **Memo and bounds** (:mod:`.score_book`). Scores are memoised by removed set, and can be saved to / loaded
  from JSON so that an interrupted search resumes without re-scoring (:mod:`.memo`); a score a ranking
  query stopped early is kept as a *bound*, never as a value, and completed when a value is asked for.
* **Trie walk** (:mod:`.trie_walk`, :mod:`.shortcuts`; ``shortcuts=False`` turns them off, to check that
  nothing changes). The boundaries of the *bases* a search extends (greedy's current set, beam's states)
  are cached too, so a candidate base ∪ {j} runs from block j; a group of sets (:meth:`SubsetEvaluator.
  score_many`) runs depth first through the trie of removal sets, a shared prefix once per batch. A ranking
  query (:meth:`SubsetEvaluator.rank_lowest`) stops scoring a candidate once a lower bound of its loss
  (perplexity, KL) exceeds the k-th best loss so far.
* **Batched sequences**, the **LM head only where needed** (at the answer positions for ``task_margin``),
  and **shared prompts** (:mod:`.packing`): each question runs as ONE sequence, its prompt followed by
  every choice, with a mask that keeps the choices apart. Models whose attention takes no 4-D mask (flash
  attention) run one sequence per choice instead.
* **KL reference** (:mod:`.reference`): the dense log-probabilities when they fit the budget, else the
  dense final hidden states, the dense LM head re-run per candidate.
* **Minibatch scores** (:mod:`.minibatch`, EvoPress) and **residual gradients** (:mod:`.gradients`, CBO).

``naive=True`` is the SLEB way, kept for the benchmark (:mod:`.bench`): a full forward per candidate (every
block, the LM head on every position, one sequence per choice), no boundary cache, no memo and no packing.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from ground.core.objectives import Objective
from pruning.calibration.config import CalibrationConfig
from pruning.calibration.objectives import configured_loss, get_objective
from pruning.calibration.objectives.batches import CalibrationBatch
from pruning.calibration.scoring import memo
from pruning.calibration.scoring.dense_pass import DenseReference
from pruning.calibration.scoring.gradients import residual_gradients
from pruning.calibration.scoring.minibatch import MinibatchScores, checked_samples
from pruning.calibration.scoring.packing import RunBatch, packs_choices, run_batches_for
from pruning.calibration.scoring.runner import BlockRunner
from pruning.calibration.scoring.score_book import RemovalSet, ScoreBook
from pruning.calibration.scoring.statistics import EvaluatorStats
from pruning.calibration.scoring.trie_walk import TrieWalk
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
        self.stack, self.config, self.model_id, self.dtype = stack, config, model_id, dtype
        self.naive, self.progress = naive, progress
        self.shortcuts = shortcuts and not naive
        self.objective = get_objective(config.objective)
        """The calibration objective's facts (:class:`~ground.core.objectives.Objective`)."""
        self.loss = configured_loss(config)
        """Its loss with the configuration's parameters, ``loss(batch, hidden, head, reference) -> per-sample
        losses``."""
        self.loss_floor = config.loss_floor
        self.needs_reference = config.needs_reference
        """Whether scoring compares against the dense model (``kl``, ``--kl-weight``)."""
        self.num_blocks, self.device = stack.num_blocks, stack.device
        self.batches = [batch.to(self.device) for batch in batches]
        self.packed = packs_choices(stack, config, self.objective, pack_choices=pack_choices, naive=naive)
        self.run_batches: list[RunBatch] = run_batches_for(batches, stack, self.packed, packed_rows)
        self.num_samples = sum(batch.num_samples for batch in batches)
        self.stats = EvaluatorStats()
        self.truncated_items = 0
        """Multiple-choice items cut to ``seq_len`` (``--truncate``; set by ``build_evaluator``)."""
        self.tokenizer = None
        """The model's tokenizer (set by ``build_evaluator``): held-out scoring draws more data with it."""
        stack.model.requires_grad_(False)  # only the residual scales α ever need gradients
        self.runner = BlockRunner(stack, self.stats, fused_blocks)
        """The blocks and LM head as scoring runs them, every call counted in :attr:`stats`."""
        self.dense = DenseReference(
            self.runner,
            self.run_batches,
            config,
            self.objective,
            memory_budget_gb * 2**30 if memory_budget_gb is not None else None,
            naive=naive,
            shortcuts=self.shortcuts,
            progress=progress,
        )
        """The dense reference pass: the cache plan, the KL reference, the boundary states."""
        plan = self.dense.plan  # its facts that benchmarks and tests read on the evaluator itself:
        self.boundaries, self.cache_bytes = plan.boundaries, plan.cache_bytes
        self.prefix_capacity, self.cache_reference_logprobs = plan.prefix_capacity, plan.reference_logprobs
        self.book = ScoreBook(self.num_samples, self.loss_floor, self.stats)
        """Values (the memo), bounds and minibatch losses of the sets scored so far."""
        if not naive:
            self.book.values[frozenset()] = self.dense.states.dense_loss()
        self.walk = TrieWalk(self.runner, self.run_batches, self.dense, self.loss, self.book)
        """Scores groups of sets through the trie of removal sets (not in naive mode)."""
        naive_losses = self._naive_batch_losses if naive else None
        self.minibatches = MinibatchScores(
            self.book, self.run_batches, self.walk, naive_losses, self.shortcuts
        )
        self._single_scores: np.ndarray | None = None
        self._gradients: np.ndarray | None = None

    @property
    def _memo(self) -> dict[RemovalSet, float]:
        """The memo, :attr:`book`'s values (by the name tests read)."""
        return self.book.values

    @property
    def search_state_bytes_most(self) -> int:
        """The most bytes the searches' states (trie nodes beyond the dense boundary cache) held at once."""
        return self.walk.prefix.most_bytes_held

    @property
    def calibration_objective(self) -> Objective:
        """The facts of the objective it scores: what searches may ask instead of comparing names."""
        return self.objective

    def _naive_batch_losses(self, removed: RemovalSet, batch_index: int) -> torch.Tensor:
        """Per-sample losses of one calibration batch by a full forward (naive mode)."""
        batch = self.batches[batch_index]
        logits = self.runner.full_forward(batch, removed)
        return self.loss(batch, logits, lambda x: x, self.dense.reference.for_batch(batch_index))

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
        if not self.naive and removed in self.book.values:
            self.stats.memo_hits += 1
            return self.book.values[removed]
        with self.stats.scoring(), torch.no_grad():
            if self.naive:
                losses = [self._naive_batch_losses(removed, index) for index in range(len(self.batches))]
                loss = float(torch.cat(losses).double().mean())
                self.stats.evaluations += 1
            else:
                self.walk.score_group([removed], remember=True)
                loss = self.book.values[removed]
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
        with self.stats.scoring(), torch.no_grad():
            self.walk.score_group(self.book.unscored(sets), remember=True)
        return [self.book.values[removed] for removed in sets]

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
        with self.stats.scoring(), torch.no_grad():
            # Only worth its forward when some candidate is still unscored.
            if any(removed not in self.book.values and removed not in self.book.bounds for removed in sets):
                self.walk.extend_from([validate_removed(base, self.num_blocks) for base in bases])
            if self.loss_floor is None:
                self.walk.score_group(self.book.unscored(sets))
            else:
                self.walk.rank_by_prior(
                    sets, keep, self.book.block_prior(self.num_blocks, self.dense.states.influence)
                )
        return [self.book.ranked(removed) for removed in sets]

    def rank_single_blocks(self, keep: int) -> list[tuple[float, bool]]:
        """The single-block prior as a ranking query (:meth:`rank_lowest` of the N one-block sets).

        All exact once :meth:`single_block_scores` has run.
        """
        if self._single_scores is not None:
            return [(float(loss), True) for loss in self._single_scores]
        return self.rank_lowest([frozenset({block}) for block in range(self.num_blocks)], keep)

    def lower_bound(self, removed_blocks) -> float | None:
        """The lower bound kept for a set whose scoring a ranking query stopped early; None for any other."""
        return self.book.lower_bound(validate_removed(removed_blocks, self.num_blocks))

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
        """:meth:`score_samples` of several sets on the same samples (:mod:`.minibatch`: only the batches
        holding ``samples`` that a set has not run yet run).

        Returns:
            One loss per set, in the order given.
        """
        sets = [validate_removed(removed, self.num_blocks) for removed in removed_sets]
        indices = checked_samples(samples, self.num_samples)
        if len(indices) == self.num_samples:
            return self.score_many(sets)  # every sample: the full loss, memoised
        with self.stats.scoring(), torch.no_grad():
            self.minibatches.fill(sets, indices)
        return [self.book.sample_mean(removed, indices) for removed in sets]

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
        return self.dense.statistics().influence.copy()

    def block_input_similarity(self) -> np.ndarray:
        """``[N, N]`` S[i, j] = mean over real calibration tokens of cos(input of block i, input of block j).

        LoRP's similarity matrix (and LLM-Streamline's criterion), from the dense reference pass: per-token
        L2-normalised block inputs (``hidden_states[0..N-1]``; the final output is not used), weighted per
        token as Block Influence is (padding left out, a shared prompt token once per choice), computed in
        float32 and accumulated in float64; symmetric with a unit diagonal.
        """
        return self.dense.statistics().similarity.copy()

    def residual_gradients(self) -> np.ndarray:
        """``[samples, N]`` per-sample gradients dL_s/dα_i at α = 1, block output h + α_i·(block(h) − h).

        CBO's matrix A. Samples are text windows or multiple-choice items. For ``kl`` every entry is 0: the
        dense model is the minimum of its own KL, so its gradient vanishes there.
        """
        if self._gradients is None:
            with self.stats.scoring():
                self._gradients = residual_gradients(
                    self.runner, self.run_batches, self.loss, self.dense.reference, self.progress
                )
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
