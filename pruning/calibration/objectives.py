"""Calibration objectives: what "the pruned model got worse" means, as one loss per calibration sample.

A calibration configuration (:class:`CalibrationConfig`) is an objective, a data source, a sample count, a
sequence length and a seed. Any objective pairs with any data source of the kind it needs, so the study's
cross-controls (margin on text? perplexity on questions' data?) are one flag away.
torch is imported inside the functions so that :class:`CalibrationConfig` (which the registry stores) is
importable without it.

Every objective in :data:`OBJECTIVES` has the same signature::

    objective(batch, hidden, head, reference) -> per-sample losses  # a tensor [batch.num_samples]

``hidden`` is the last block's output ``[sequences, seq, hidden]`` and ``head`` maps hidden states to logits
(final norm + LM head). Objectives call ``head`` only on the positions they need: all next-token positions
for ``perplexity`` and ``kl``, only the answer positions for ``task_margin``. ``reference(row)`` returns the
dense model's log-probabilities ``[seq, vocab]`` of one sequence (``kl`` only). The calibration loss is the
mean of the per-sample losses; lower is better.

* ``perplexity`` — mean next-token NLL of a text window (its exp is the perplexity).
* ``task_margin`` — PuDDing's task likelihood margin: with ℓ(choice) the mean log-probability of the answer
  tokens given ``"Question: {context}\\nAnswer: {choice}"`` (for a fill-in-the-blank item, of the sentence
  with the blank filled: PuDDing's WinoGrande), an item with correct choice c scores Σ_{j≠c} (ℓ_c − ℓ_j); its
  loss is the negated margin (more negative = better). The choices are answer *texts*
  (:mod:`pruning.calibration.commonsense` parses them out of Commonsense-170k's instructions).
* ``kl`` — KL(dense ‖ pruned) of the next-token distribution, averaged over a window's positions (EvoPress).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from depthprune.errors import UserError
from pruning.calibration.data import (
    MULTIPLE_CHOICE,
    SAMPLINGS,
    SENTENCE_SCORING,
    TEXT,
    ChoiceSamples,
    TextSamples,
    parse_spec,
)

if TYPE_CHECKING:
    import torch

PROMPT_TEMPLATE = "Question: {context}\nAnswer:"
ANSWER_TEMPLATE = " {choice}"

# Positions sent through the LM head at once: bounds the [positions, vocab] logits of large vocabularies.
HEAD_CHUNK_POSITIONS = 4096


@dataclass
class CalibrationBatch:
    """A batch of calibration sequences with what the objectives need to score them.

    Sequences are right-padded; with causal attention the padding never influences a real position, so no
    attention mask is needed and a batched forward equals one forward per sequence.
    """

    input_ids: torch.Tensor
    """``[sequences, seq]`` token ids."""
    token_mask: torch.Tensor
    """``[sequences, seq]`` True on real (non-padding) tokens."""
    num_samples: int
    """Calibration samples in the batch: text windows, or multiple-choice items."""
    answer_rows: torch.Tensor | None = None
    """Multiple choice: ``[answer tokens]`` sequence of each answer token."""
    answer_positions: torch.Tensor | None = None
    """Multiple choice: position whose next-token prediction is that answer token."""
    answer_tokens: torch.Tensor | None = None
    """Multiple choice: the answer token ids."""
    sequence_item: torch.Tensor | None = None
    """Multiple choice: ``[sequences]`` item (0..num_samples-1) each sequence belongs to."""
    correct_sequence: torch.Tensor | None = None
    """Multiple choice: ``[num_samples]`` sequence holding each item's correct choice."""

    def to(self, device) -> CalibrationBatch:
        moved = {
            name: value.to(device) if hasattr(value, "to") else value for name, value in self.__dict__.items()
        }
        return CalibrationBatch(**moved)


Head = Callable[["torch.Tensor"], "torch.Tensor"]
Reference = Callable[[int], "torch.Tensor"]


def _float(tensor: torch.Tensor) -> torch.Tensor:
    """Losses in at least float32 (bf16 logits lose too much), float64 kept for exact checks."""
    import torch

    return tensor if tensor.dtype == torch.float64 else tensor.float()


def _chunked(hidden: torch.Tensor):
    for start in range(0, hidden.shape[0], HEAD_CHUNK_POSITIONS):
        yield start, hidden[start : start + HEAD_CHUNK_POSITIONS]


def perplexity(
    batch: CalibrationBatch, hidden: torch.Tensor, head: Head, reference: Reference | None = None
) -> torch.Tensor:
    """Mean next-token negative log-likelihood per text window ``[num_samples]``."""
    import torch
    import torch.nn.functional as F

    losses = []
    for row in range(hidden.shape[0]):
        targets = batch.input_ids[row, 1:]
        total = _float(hidden.new_zeros(()))
        for start, chunk in _chunked(hidden[row, :-1]):
            logits = _float(head(chunk))
            total = total + F.cross_entropy(logits, targets[start : start + chunk.shape[0]], reduction="sum")
        losses.append(total / targets.shape[0])
    return torch.stack(losses)


def kl(
    batch: CalibrationBatch, hidden: torch.Tensor, head: Head, reference: Reference | None = None
) -> torch.Tensor:
    """Mean KL(dense ‖ pruned) of the next-token distribution per text window ``[num_samples]``."""
    import torch
    import torch.nn.functional as F

    if reference is None:
        raise ValueError("the kl objective needs the dense model's log-probabilities")
    losses = []
    for row in range(hidden.shape[0]):
        dense_logprobs = reference(row)
        total = _float(hidden.new_zeros(()))
        for start, chunk in _chunked(hidden[row]):
            logprobs = torch.log_softmax(_float(head(chunk)), dim=-1)
            dense = dense_logprobs[start : start + chunk.shape[0]].to(logprobs.device, logprobs.dtype)
            total = total + F.kl_div(logprobs, dense, log_target=True, reduction="sum")
        losses.append(total / hidden.shape[1])
    return torch.stack(losses)


def sum_by_index(values: torch.Tensor, index: torch.Tensor, size: int) -> torch.Tensor:
    """``out[i] = sum of values[j] where index[j] == i``, the same bits on every run.

    ``index_add`` adds with atomics on CUDA, in an order that changes between runs, so equal removal sets
    could score differently by a rounding and a search could take another branch. On CUDA the sum is a
    product with a one-hot matrix instead (a fixed reduction order); on the CPU ``index_add`` is already
    sequential and keeps the values earlier runs recorded.
    """
    if values.device.type == "cpu":
        return values.new_zeros(size).index_add(0, index, values)
    return one_hot_sum(values, index, size)


def one_hot_sum(values: torch.Tensor, index: torch.Tensor, size: int) -> torch.Tensor:
    """:func:`sum_by_index` as a product with a one-hot matrix: no atomics, differentiable."""
    import torch

    return values @ torch.nn.functional.one_hot(index, size).to(values.dtype)


def task_margin(
    batch: CalibrationBatch, hidden: torch.Tensor, head: Head, reference: Reference | None = None
) -> torch.Tensor:
    """Negated PuDDing margin per multiple-choice item ``[num_samples]``.

    The LM head sees the answer positions only.
    """
    import torch

    answer_hidden = hidden[batch.answer_rows, batch.answer_positions]
    token_logprobs = []
    for start, chunk in _chunked(answer_hidden):
        logprobs = torch.log_softmax(_float(head(chunk)), dim=-1)
        tokens = batch.answer_tokens[start : start + chunk.shape[0]]
        token_logprobs.append(logprobs.gather(1, tokens[:, None])[:, 0])
    token_logprobs = torch.cat(token_logprobs)
    sequences = hidden.shape[0]
    answer_sum = sum_by_index(token_logprobs, batch.answer_rows, sequences)
    answer_len = sum_by_index(torch.ones_like(token_logprobs), batch.answer_rows, sequences)
    mean_logprob = answer_sum / answer_len  # ℓ per (item, choice) sequence
    items = batch.num_samples
    total = sum_by_index(mean_logprob, batch.sequence_item, items)
    choices = sum_by_index(torch.ones_like(mean_logprob), batch.sequence_item, items)
    # Σ_{j≠c} (ℓ_c − ℓ_j) = k·ℓ_c − Σ_j ℓ_j
    margin = choices * mean_logprob[batch.correct_sequence] - total
    return -margin


@dataclass(frozen=True)
class Objective:
    """One entry of :data:`OBJECTIVES`."""

    name: str
    """Its key in :data:`OBJECTIVES`."""
    data_kind: str
    """The data kind it scores: ``"text"`` or ``"multiple_choice"``."""
    loss: Callable[..., torch.Tensor] = field(repr=False)
    """``loss(batch, hidden, head, reference) -> [num_samples]`` per-sample losses."""
    needs_reference: bool = False
    """Whether it compares against the dense model's log-probabilities."""
    description: str = ""
    """One line for ``--help`` and reports."""

    def check_data(self, spec: str) -> None:
        """Raise a :class:`UserError` when the data spec is of the wrong kind for this objective."""
        kind = parse_spec(spec).kind
        if kind != self.data_kind:
            wanted = (
                "text (e.g. demo:text, c4, text:PATH)"
                if self.data_kind == TEXT
                else "multiple-choice questions (e.g. demo:qa, commonsense170k, mc:PATH)"
            )
            raise UserError(
                f"objective {self.name!r} needs {wanted}, but data {spec!r} is {kind.replace('_', '-')}"
            )


OBJECTIVES: dict[str, Objective] = {
    "perplexity": Objective("perplexity", TEXT, perplexity, description="mean next-token NLL on text"),
    "task_margin": Objective(
        "task_margin",
        MULTIPLE_CHOICE,
        task_margin,
        description="negated PuDDing likelihood margin of the correct answer",
    ),
    "kl": Objective(
        "kl",
        TEXT,
        kl,
        needs_reference=True,
        description="KL(dense || pruned) of the next-token distribution on text",
    ),
}


def get_objective(name: str) -> Objective:
    """The objective called ``name``, or a :class:`UserError` listing them."""
    if name not in OBJECTIVES:
        raise UserError(f"unknown objective {name!r}; use one of: {', '.join(OBJECTIVES)}")
    return OBJECTIVES[name]


@dataclass
class CalibrationConfig:
    """A calibration configuration: what a pruning run minimises, and on which data.

    ``dataclasses.asdict`` of it is what the registry stores.
    """

    objective: str
    """A key of :data:`OBJECTIVES`: ``perplexity``, ``task_margin`` or ``kl``."""
    data: str
    """A data spec (:mod:`pruning.calibration.data`): ``c4``, ``wikitext2``, ``lambada``, ``commonsense170k``
    (``commonsense170k:PATH`` for a local copy), ``pydoc``, ``pydoc-cloze``, ``demo:text``, ``demo:qa``,
    ``text:PATH`` or ``mc:PATH``; its kind must suit the objective."""
    samples: int = 64
    """Calibration samples: text instances, or multiple-choice items (the study uses 64)."""
    seq_len: int = 2048
    """Tokens per text instance; the longest a question plus answer may be (the study truncates to 2048)."""
    seed: int = 0
    """Seed of the sample draw."""
    sampling: str = "documents"
    """Text only: ``documents`` (one document per instance, truncated to ``seq_len``, shorter ones skipped:
    the study's and SLEB's way) or ``stream`` (random windows of all documents joined, SparseGPT's). See
    :mod:`pruning.calibration.data`."""

    def __post_init__(self):
        get_objective(self.objective).check_data(self.data)
        if self.sampling not in SAMPLINGS:
            raise UserError(f"unknown sampling {self.sampling!r}; use one of {', '.join(SAMPLINGS)}")
        for name, lowest in (("samples", 1), ("seq_len", 2), ("seed", 0)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < lowest:
                raise UserError(f"calibration {name} must be an integer >= {lowest}, got {value!r}")

    @property
    def kind(self) -> str:
        """The data kind, ``"text"`` or ``"multiple_choice"``."""
        return get_objective(self.objective).data_kind


# --------------------------------------------------------------------------------------------- batching


def _pad_id(tokenizer) -> int:
    for candidate in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if candidate is not None:
            return candidate
    return 0


def text_batches(samples: TextSamples, batch_size: int) -> list[CalibrationBatch]:
    """Text windows in batches of ``batch_size`` (all windows have the same length: no padding)."""
    import torch

    batches = []
    for start in range(0, len(samples.input_ids), batch_size):
        ids = torch.tensor(samples.input_ids[start : start + batch_size], dtype=torch.long)
        batches.append(CalibrationBatch(ids, torch.ones_like(ids, dtype=torch.bool), ids.shape[0]))
    return batches


def encode_choice(
    tokenizer, context: str, choice: str, seq_len: int, scoring: str = "answer"
) -> tuple[list[int], int]:
    """Token ids of ``Question: {context}\\nAnswer: {choice}`` and where the answer starts.

    The prompt and the answer are tokenized separately (as lm-eval does with context and continuation) so
    that the answer tokens are the same whatever precedes them; a prompt too long for ``seq_len`` loses its
    beginning, never the answer. With ``scoring="sentence"`` the choice fills the blank ``_`` of ``context``
    and every token of the sentence after the first is scored (PuDDing's WinoGrande): the start is 1.
    """
    if scoring == SENTENCE_SCORING:
        ids = tokenizer(context.replace("_", choice))["input_ids"][-seq_len:]
        if len(ids) < 2:
            raise UserError(f"sentence {context[:40]!r} with {choice!r} is too short to score")
        return ids, 1
    prompt = tokenizer(PROMPT_TEMPLATE.format(context=context))["input_ids"]
    answer = tokenizer(ANSWER_TEMPLATE.format(choice=choice), add_special_tokens=False)["input_ids"]
    if not answer:
        raise UserError(f"choice {choice!r} tokenizes to nothing")
    if len(answer) >= seq_len:
        raise UserError(f"choice {choice[:40]!r} is {len(answer)} tokens, too long for seq_len {seq_len}")
    prompt = prompt[-(seq_len - len(answer)) :]
    return prompt + answer, len(prompt)


def choice_batches(
    samples: ChoiceSamples, tokenizer, seq_len: int, batch_size: int
) -> list[CalibrationBatch]:
    """Multiple-choice items as batches of (item, choice) sequences; an item's choices share a batch.

    ``batch_size`` bounds the sequences per batch (an item with more choices gets a batch of its own).
    """
    import torch

    encoded = [
        [encode_choice(tokenizer, item.context, choice, seq_len, item.scoring) for choice in item.choices]
        for item in samples.items
    ]
    groups, current, current_sequences = [], [], 0
    for index, item in enumerate(samples.items):
        if current and current_sequences + len(item.choices) > batch_size:
            groups.append(current)
            current, current_sequences = [], 0
        current.append(index)
        current_sequences += len(item.choices)
    if current:
        groups.append(current)
    pad = _pad_id(tokenizer)
    batches = []
    for group in groups:
        sequences = [sequence for index in group for sequence in encoded[index]]
        width = max(len(ids) for ids, _ in sequences)
        input_ids = torch.full((len(sequences), width), pad, dtype=torch.long)
        token_mask = torch.zeros((len(sequences), width), dtype=torch.bool)
        rows, positions, tokens, sequence_item, correct = [], [], [], [], []
        row = 0
        for local_item, index in enumerate(group):
            item = samples.items[index]
            for choice_index, (ids, answer_start) in enumerate(encoded[index]):
                input_ids[row, : len(ids)] = torch.tensor(ids)
                token_mask[row, : len(ids)] = True
                for position in range(answer_start, len(ids)):
                    rows.append(row)
                    positions.append(position - 1)  # the logits at position p predict token p + 1
                    tokens.append(ids[position])
                sequence_item.append(local_item)
                if choice_index == item.label:
                    correct.append(row)
                row += 1
        batches.append(
            CalibrationBatch(
                input_ids,
                token_mask,
                len(group),
                answer_rows=torch.tensor(rows),
                answer_positions=torch.tensor(positions),
                answer_tokens=torch.tensor(tokens),
                sequence_item=torch.tensor(sequence_item),
                correct_sequence=torch.tensor(correct),
            )
        )
    return batches


def make_batches(
    samples: TextSamples | ChoiceSamples, tokenizer, seq_len: int, batch_size: int
) -> list[CalibrationBatch]:
    """Calibration samples of either kind in batches of at most ``batch_size`` sequences."""
    if isinstance(samples, TextSamples):
        return text_batches(samples, batch_size)
    return choice_batches(samples, tokenizer, seq_len, batch_size)
