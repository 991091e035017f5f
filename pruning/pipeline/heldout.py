"""Held-out scores of a run's outcomes: validation loss (selection), perplexity and accuracy (quality gate).

After the searches of a ``prune`` run, every outcome is scored on data the searches never saw, with the
calibration evaluator's model (no second copy):

* **validation loss**: the calibration configuration's own loss (objective, parameters, KL) on the
  validation data (:mod:`pruning.calibration.data.validation`); ``prune`` marks the outcome with the lowest
  as ``selected``, and ``<objective>-best`` aliases follow it;
* **held-out perplexity**: on the validation text for a text objective, else on ``pydoc``'s ``test`` split
  (:data:`FITNESS_TEXT`, Python's own documentation: on every machine, never a calibration split);
* **task accuracy** (multiple-choice objectives): on the validation items, against chance (mean 1/choices);
* **fit**: :func:`ground.core.fitness.fitness` of those against the dense model's.

A repaired child (``heal --method patch``) is scored whole by the same class on its parent's validation data
(:func:`repaired_quality`), so that its validation loss compares with the searched variants'.

Each scorer is a naive :class:`~pruning.calibration.scoring.evaluator.SubsetEvaluator` (a full forward per
set, nothing cached): a handful of sets is scored, and the calibration evaluator's caches stay as they are.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from ground.core.fitness import DEFAULT_MAX_PPL_RATIO, fitness
from pruning.calibration.config import CalibrationConfig
from pruning.calibration.data.items import TEXT
from pruning.calibration.data.sampling import sample_stream_windows
from pruning.calibration.data.specs import load_documents
from pruning.calibration.data.validation import validation_samples
from pruning.calibration.objectives.batches import CalibrationBatch, make_batches
from pruning.calibration.objectives.task_margin import answer_logprobs
from pruning.calibration.scoring.evaluator import SubsetEvaluator
from pruning.calibration.scoring.packing import RunBatch, as_run_batch, pack_choice_batches

FITNESS_TEXT = "pydoc"
"""Held-out text of multiple-choice objectives' quality gate (its ``test`` split)."""
FITNESS_WINDOWS = 8
"""Windows of held-out text the quality gate's perplexity reads."""
FITNESS_WINDOW_TOKENS = 256
"""Tokens per window (at most; the calibration ``seq_len`` when shorter)."""
BATCH_SIZE = 8


def choice_runs(scorer: SubsetEvaluator) -> list[RunBatch]:
    """A multiple-choice scorer's items as held-out scoring runs them: each item's choices packed into one
    sequence that computes their shared prompt once (:mod:`pruning.calibration.scoring.packing`: every
    answer token's log-probability is the one of its choice run alone; about a third of the time of one
    row per choice on SmolLM2 and the pydoc items), or one row per choice where the attention
    implementation takes no 4-D mask."""
    batches = [batch.to("cpu") for batch in scorer.batches]
    if scorer.stack.supports_segment_masks:
        return pack_choice_batches(batches, scorer.stack, BATCH_SIZE)
    return [as_run_batch(batch) for batch in batches]


def choice_scores(
    scorer: SubsetEvaluator, removed: frozenset[int]
) -> list[tuple[CalibrationBatch, torch.Tensor]]:
    """ℓ (mean answer-token log-probability) of every choice of the scorer's items without ``removed``: per
    run, its batch (which items the choices belong to) and ``[choices]`` scores."""
    scored = []
    for run in choice_runs(scorer):
        run = run.to(scorer.device)
        # The LM head at the answer positions only: full-vocabulary logits of every position cost a fifth
        # of a small model's compute and [sequences x length x vocabulary] floats of memory.
        hidden = scorer.stack.final_hidden(run.input_ids, removed, run.attention_mask, run.position_ids)
        with torch.no_grad():
            scores = answer_logprobs(run.calibration, run.objective_hidden(hidden), scorer.stack.head)
        scored.append((run.calibration, scores))
    return scored


def choice_accuracy(scorer: SubsetEvaluator, removed: frozenset[int]) -> tuple[float, float]:
    """``(accuracy, chance)`` of the model without ``removed`` on a multiple-choice scorer's items: an item
    is right when its correct choice has the highest ℓ (mean answer-token log-probability); chance is the
    mean of 1 / choices."""
    return accuracy_of(choice_scores(scorer, removed))


def accuracy_of(scored: list[tuple[CalibrationBatch, torch.Tensor]]) -> tuple[float, float]:
    """``(accuracy, chance)`` from :func:`choice_scores`' output (see :func:`choice_accuracy`)."""
    correct, chance, items = 0, 0.0, 0
    for batch, scores in scored:
        for item in range(batch.num_samples):
            rows = (batch.sequence_item == item).nonzero()[:, 0]
            best = rows[torch.argmax(scores[rows])]
            correct += int(best == batch.correct_sequence[item])
            chance += 1 / len(rows)
        items += batch.num_samples
    return correct / items, chance / items


def naive_scorer(evaluator, config: CalibrationConfig, samples, tokenizer) -> SubsetEvaluator:
    """A naive evaluator of ``config`` on ``samples`` sharing ``evaluator``'s model (nothing cached)."""
    batches = make_batches(samples, tokenizer, config.seq_len, BATCH_SIZE, truncate=config.truncate)
    return SubsetEvaluator(
        evaluator.stack, config, batches, model_id=evaluator.model_id, naive=True, progress=False
    )


class HeldOut:
    """Scores removal sets on held-out data with a calibration evaluator's model (module docstring)."""

    def __init__(
        self, evaluator, validation: str | None = None, max_ppl_ratio: float = DEFAULT_MAX_PPL_RATIO
    ):
        config: CalibrationConfig = evaluator.config
        tokenizer = evaluator.tokenizer
        self.config = config
        self.max_ppl_ratio = max_ppl_ratio
        self.what, samples = validation_samples(config, tokenizer, validation)
        self.validation = naive_scorer(evaluator, config, samples, tokenizer)
        if config.kind == TEXT:
            perplexity = dataclasses.replace(config, objective="perplexity", kl_weight=0.0)
            # Under the perplexity objective the validation loss is the held-out log perplexity itself: one
            # scorer, one pass per removal set (the demo's perplexity step scored every window twice).
            same = perplexity == config
            self.text = self.validation if same else naive_scorer(evaluator, perplexity, samples, tokenizer)
        else:
            length = min(config.seq_len, FITNESS_WINDOW_TOKENS)
            windows = sample_stream_windows(
                load_documents(FITNESS_TEXT, "test"), tokenizer, FITNESS_WINDOWS, length, 0, FITNESS_TEXT
            )
            text_config = CalibrationConfig("perplexity", FITNESS_TEXT, FITNESS_WINDOWS, length)
            self.text = naive_scorer(evaluator, text_config, windows, tokenizer)
        self.dense = self._measure(frozenset())

    def _accuracy(self, removed: frozenset[int]) -> tuple[float, float] | None:
        """``(accuracy, chance)`` on the validation items; None for text."""
        return None if self.config.kind == TEXT else choice_accuracy(self.validation, removed)

    def _measure(self, removed: frozenset[int]) -> dict:
        validation_loss = self.validation.score(removed)
        text_loss = validation_loss if self.text is self.validation else self.text.score(removed)
        measured = {"validation_loss": validation_loss, "perplexity": math.exp(min(text_loss, 700.0))}
        accuracy = self._accuracy(removed)
        if accuracy is not None:
            measured["accuracy"], measured["chance"] = accuracy
        return measured

    def quality(self, removed_blocks) -> dict:
        """The quality record of one removal set (``VariantRecord.quality``): validation loss, held-out
        perplexity (and accuracy) against the dense model's, K, the verdict ``fit`` and its ``reasons``."""
        return self.record(self._measure(frozenset(removed_blocks)), self.dense)

    def record(self, measured: dict, dense: dict) -> dict:
        """The quality record of ``measured`` (what :meth:`_measure` returns) against ``dense``'s."""
        fit, reasons = fitness(
            measured["perplexity"],
            dense["perplexity"],
            self.max_ppl_ratio,
            measured.get("accuracy"),
            dense.get("accuracy"),
            measured.get("chance"),
        )
        return {
            **measured,
            "validation_data": self.what,
            "dense_validation_loss": dense["validation_loss"],
            "dense_perplexity": dense["perplexity"],
            **({"dense_accuracy": dense["accuracy"]} if dense.get("accuracy") is not None else {}),
            "perplexity_data": self.what if self.config.kind == TEXT else f"{FITNESS_TEXT} (test split)",
            "max_ppl_ratio": self.max_ppl_ratio,
            "fit": fit,
            "reasons": reasons,
        }


@dataclass(frozen=True)
class WholeModel:
    """What :class:`HeldOut` reads of a calibration evaluator, for a model scored whole (every block its own):
    a repaired child, whose removal is built into its checkpoint."""

    stack: object
    """Its :class:`~pruning.model.blocks.BlockStack`."""
    config: CalibrationConfig
    """The parent's calibration configuration (objective, parameters, data, samples, seed)."""
    tokenizer: object
    model_id: str


def incomparable(calibration: dict, parent_quality: dict | None) -> str | None:
    """Why a repaired child of a parent with this calibration and quality record cannot have a validation
    loss comparable with the parent's (:func:`repaired_quality`), or None when it can."""
    recorded = parent_quality or {}
    if not all(isinstance(recorded.get(key), int | float) for key in ("validation_loss", "dense_perplexity")):
        return "its parent has no validation loss to compare with"
    if CalibrationConfig.from_record(calibration).needs_reference:
        return "its objective reads the dense model's distribution (KL), which the child scored whole lacks"
    return None


def repaired_quality(causal_lm, tokenizer, parent, model_id: str) -> dict | None:
    """The quality record of a repaired child (``heal --method patch``) of ``parent`` (its registry entry),
    comparable with the parent's; None when :func:`incomparable` says why not.

    The child is scored whole by :class:`HeldOut` (the scorer ``prune`` ran on the parent's removal set) on
    the parent's validation data (its recorded ``validation_data``: the same spec, samples and seed, so the
    same windows or items), under the parent's calibration configuration; held-out perplexity (and accuracy)
    and the verdict ``fit`` are against the dense values and K that the parent's record holds.
    """
    from pruning.calibration.data.validation import validation_spec
    from pruning.model.blocks import BlockStack

    if incomparable(parent.calibration, parent.quality) is not None:
        return None
    recorded = parent.quality
    config = CalibrationConfig.from_record(parent.calibration)
    spec = validation_spec(config, recorded.get("validation_data"))
    max_ppl_ratio = recorded.get("max_ppl_ratio", DEFAULT_MAX_PPL_RATIO)
    held_out = HeldOut(WholeModel(BlockStack(causal_lm), config, tokenizer, model_id), spec, max_ppl_ratio)
    dense = {
        "validation_loss": recorded.get("dense_validation_loss"),
        "perplexity": recorded["dense_perplexity"],
        "accuracy": recorded.get("dense_accuracy"),
    }
    record = held_out.record(held_out.dense, dense)  # HeldOut's "dense" is the child here, scored whole
    return {**record, "parent_validation_loss": recorded["validation_loss"]}
