"""Calibration batches: samples (text windows, multiple-choice items) laid out as what the objectives score.

Text windows of equal length batch without padding; a multiple-choice item becomes one sequence per choice
(``"Question: {context}\nAnswer: {choice}"``, or the filled sentence for ``scoring="sentence"``) with the
answer positions the ``task_margin`` loss reads. torch is imported inside the functions so that the data
classes import without it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ground.core.errors import UserError
from pruning.calibration.data.items import SENTENCE_SCORING, ChoiceSamples, TextSamples

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


def as_loss_dtype(tensor: torch.Tensor) -> torch.Tensor:
    """Losses in at least float32 (bf16 logits lose too much), float64 kept for exact checks."""
    import torch

    return tensor if tensor.dtype == torch.float64 else tensor.float()


def chunked(hidden: torch.Tensor):
    """``(start, chunk)`` pieces of ``[positions, hidden]`` states small enough for one LM head call."""
    for start in range(0, hidden.shape[0], HEAD_CHUNK_POSITIONS):
        yield start, hidden[start : start + HEAD_CHUNK_POSITIONS]


# --------------------------------------------------------------------------------------------- batching


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
    tokenizer, context: str, choice: str, seq_len: int, scoring: str = "answer", truncate: bool = False
) -> tuple[list[int], int, bool]:
    """Token ids of ``Question: {context}\\nAnswer: {choice}``, where the answer starts, and whether the
    prompt was cut.

    The prompt and the answer are tokenized separately (as lm-eval does with context and continuation) so
    that the answer tokens are the same whatever precedes them. A sequence longer than ``seq_len`` is a
    :class:`~depthprune.errors.UserError` naming the length needed, unless ``truncate``: then the prompt
    loses its beginning, never the answer. With ``scoring="sentence"`` the choice fills the blank ``_`` of
    ``context`` and every token of the sentence after the first is scored (PuDDing's WinoGrande): the start
    is 1.
    """
    if scoring == SENTENCE_SCORING:
        ids = tokenizer(context.replace("_", choice))["input_ids"]
        if len(ids) > seq_len and not truncate:
            raise TooLong(len(ids))
        if len(ids[-seq_len:]) < 2:
            raise UserError(f"sentence {context[:40]!r} with {choice!r} is too short to score")
        return ids[-seq_len:], 1, len(ids) > seq_len
    prompt = tokenizer(PROMPT_TEMPLATE.format(context=context))["input_ids"]
    answer = tokenizer(ANSWER_TEMPLATE.format(choice=choice), add_special_tokens=False)["input_ids"]
    if not answer:
        raise UserError(f"choice {choice!r} tokenizes to nothing")
    if len(answer) >= seq_len:
        raise UserError(f"choice {choice[:40]!r} is {len(answer)} tokens, too long for seq_len {seq_len}")
    needed = len(prompt) + len(answer)
    if needed > seq_len and not truncate:
        raise TooLong(needed)
    prompt = prompt[-(seq_len - len(answer)) :]
    return prompt + answer, len(prompt), needed > seq_len


class TooLong(UserError):
    """An item longer than ``seq_len`` (its length needed); :func:`encode_items` names the item."""

    def __init__(self, needed: int):
        super().__init__(f"needs {needed} tokens")
        self.needed = needed


def encode_items(
    samples: ChoiceSamples, tokenizer, seq_len: int, truncate: bool = False
) -> tuple[list[list[tuple[list[int], int]]], int]:
    """Every item's choice sequences ``(ids, answer start)``, and how many items were cut to ``seq_len``.

    Raises:
        UserError: an item longer than ``seq_len`` (without ``truncate``), named with the length it needs.
    """
    encoded, truncated = [], 0
    for index, item in enumerate(samples.items):
        sequences, cut = [], False
        for choice in item.choices:
            try:
                ids, start, was_cut = encode_choice(
                    tokenizer, item.context, choice, seq_len, item.scoring, truncate
                )
            except TooLong as error:
                raise UserError(
                    f"item {index} of {samples.source} ({item.context[:40]!r}) needs {error.needed} tokens, "
                    f"more than --seq-len {seq_len}: raise --seq-len to {error.needed} or pass --truncate"
                ) from None
            sequences.append((ids, start))
            cut = cut or was_cut
        encoded.append(sequences)
        truncated += cut
    return encoded, truncated


def choice_batches(
    samples: ChoiceSamples, tokenizer, seq_len: int, batch_size: int, truncate: bool = False
) -> list[CalibrationBatch]:
    """Multiple-choice items as batches of (item, choice) sequences; an item's choices share a batch.

    ``batch_size`` bounds the sequences per batch (an item with more choices gets a batch of its own). An
    item longer than ``seq_len`` is refused unless ``truncate`` (:func:`encode_items`).
    """
    import torch

    encoded, _ = encode_items(samples, tokenizer, seq_len, truncate)
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
    samples: TextSamples | ChoiceSamples, tokenizer, seq_len: int, batch_size: int, truncate: bool = False
) -> list[CalibrationBatch]:
    """Calibration samples of either kind in batches of at most ``batch_size`` sequences (``truncate``:
    multiple-choice items only, :func:`choice_batches`)."""
    if isinstance(samples, TextSamples):
        return text_batches(samples, batch_size)
    return choice_batches(samples, tokenizer, seq_len, batch_size, truncate)


def truncated_items(samples: TextSamples | ChoiceSamples, tokenizer, seq_len: int) -> int:
    """How many multiple-choice items ``--truncate`` cuts to ``seq_len`` (0 for text)."""
    if isinstance(samples, TextSamples):
        return 0
    return encode_items(samples, tokenizer, seq_len, truncate=True)[1]
