"""How the subset evaluator lays calibration batches out for the blocks: as they are, or choices packed.

A multiple-choice item's choice sequences ``"Question: …\\nAnswer: {choice}"`` share their prompt. Run one
sequence per choice and every candidate evaluation recomputes that prompt once per choice. Packed, an item
is ONE sequence ``[shared prefix][choice 1 rest][choice 2 rest]...`` with a 4-D attention mask (each choice
sees the prefix and its own earlier tokens, never another choice) and positions that restart at the prefix
length for every choice (:meth:`pruning.model.blocks.BlockStack.segment_attention_mask`), so every answer
token's log-probability is exactly the one of the choice run alone. The shared prefix is the longest common
prefix of the item's token sequences (the prompt, plus any answer tokens all choices begin with; a prompt that
``encode_choice`` truncated differently per choice simply shares less).

The objectives keep their per-choice definition: :meth:`RunBatch.objective_hidden` gathers the packed hidden
states at the positions predicting answer tokens into a ``[choices, answer tokens, hidden]`` tensor that
the unchanged ``task_margin`` reads as one row per choice (the last prefix token predicts every choice's
first answer token).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ground.core.objectives import MULTIPLE_CHOICE, Objective
from pruning.calibration.config import CalibrationConfig
from pruning.calibration.objectives.batches import CalibrationBatch
from pruning.model.blocks import BlockStack


@dataclass
class RunBatch:
    """One batch as the decoder blocks run it, and how the objective reads the last block's output."""

    input_ids: torch.Tensor
    """``[rows, width]`` token ids the blocks see (one row per item when packed)."""
    calibration: CalibrationBatch
    """What the objective scores (for packed choices: answer positions index :meth:`objective_hidden`)."""
    token_weight: torch.Tensor
    """``[rows, width]`` how many calibration sequences contain each position (0 on padding): a shared
    prefix token stands for one token per choice (Block Influence weighs it so)."""
    sample_of_row: torch.Tensor
    """``[rows]`` calibration sample (text window or item) each row belongs to."""
    attention_mask: torch.Tensor | dict | None = None
    """``None`` (causal; right padding never reaches a real token) or a segment mask for ``prepare``."""
    position_ids: torch.Tensor | None = None
    """``[rows, width]`` positions, restarting per choice when packed; ``None`` for ``0..width-1``."""
    gather_rows: torch.Tensor | None = None
    """Packed only: ``[choices, max answer tokens]`` packed row predicting each answer token."""
    gather_positions: torch.Tensor | None = None
    """Packed only: ``[choices, max answer tokens]`` packed position predicting each answer token."""

    @property
    def packed(self) -> bool:
        return self.gather_rows is not None

    def objective_hidden(self, hidden: torch.Tensor) -> torch.Tensor:
        """The last block's output as the objective indexes it (``[choices, answers, hidden]`` packed)."""
        if self.gather_rows is None:
            return hidden
        return hidden[self.gather_rows, self.gather_positions]

    def to(self, device) -> RunBatch:
        def move(value):
            if isinstance(value, dict):
                return {key: tensor.to(device) for key, tensor in value.items()}
            return value.to(device) if hasattr(value, "to") else value

        return RunBatch(**{name: move(value) for name, value in self.__dict__.items()})


def as_run_batch(batch: CalibrationBatch) -> RunBatch:
    """A calibration batch run as it is: one row per text window or per (item, choice) sequence."""
    rows = batch.input_ids.shape[0]
    sample_of_row = batch.sequence_item if batch.sequence_item is not None else torch.arange(rows)
    return RunBatch(batch.input_ids, batch, batch.token_mask.to(torch.float64), sample_of_row)


def _common_prefix_length(sequences: list[list[int]]) -> int:
    length = 0
    for tokens in zip(*sequences):
        if any(token != tokens[0] for token in tokens):
            break
        length += 1
    return length


def pack_choices(batch: CalibrationBatch, stack: BlockStack) -> RunBatch:
    """Pack each multiple-choice item of ``batch`` into one sequence sharing its common prefix.

    Args:
        batch: a multiple-choice calibration batch (one row per choice, an item's choices together).
        stack: the model, for the form of its attention mask.

    Returns:
        A :class:`RunBatch` with one row per item whose objective reading equals the unpacked batch's.
    """
    if batch.sequence_item is None:
        raise ValueError("only multiple-choice batches can be packed")
    lengths = batch.token_mask.sum(dim=1).tolist()
    sequences = [batch.input_ids[row, :length].tolist() for row, length in enumerate(lengths)]
    rows_of_item = [
        (batch.sequence_item == item).nonzero()[:, 0].tolist() for item in range(batch.num_samples)
    ]
    packed_ids, segments, positions, weights = [], [], [], []
    # where (choice row, position) of the unpacked batch lies in the packed batch
    place: dict[tuple[int, int], tuple[int, int]] = {}
    for item, choice_rows in enumerate(rows_of_item):
        shared = _common_prefix_length([sequences[row] for row in choice_rows])
        ids = sequences[choice_rows[0]][:shared]
        item_segments, item_positions = [0] * shared, list(range(shared))
        item_weights = [float(len(choice_rows))] * shared
        for number, row in enumerate(choice_rows, start=1):
            for position in range(shared):
                place[row, position] = (item, position)
            for position in range(shared, len(sequences[row])):
                place[row, position] = (item, len(ids))
                ids.append(sequences[row][position])
                item_segments.append(number)
                item_positions.append(position)
                item_weights.append(1.0)
        packed_ids.append(ids)
        segments.append(item_segments)
        positions.append(item_positions)
        weights.append(item_weights)
    width = max(len(ids) for ids in packed_ids)

    def padded(values, fill, dtype):
        return torch.tensor([row + [fill] * (width - len(row)) for row in values], dtype=dtype)

    segment_ids = padded(segments, -1, torch.long)
    position_ids = padded(positions, 0, torch.long)
    # Answer tokens in the choices' order (task_margin reads them per row = per choice).
    answer_rows, answer_positions = batch.answer_rows.tolist(), batch.answer_positions.tolist()
    choices = batch.input_ids.shape[0]
    counts = [0] * choices
    local_index = []
    for row in answer_rows:
        local_index.append(counts[row])
        counts[row] += 1
    gather_rows = torch.zeros(choices, max(counts), dtype=torch.long)
    gather_positions = torch.zeros(choices, max(counts), dtype=torch.long)
    for row, position, local in zip(answer_rows, answer_positions, local_index):
        gather_rows[row, local], gather_positions[row, local] = place[row, position]
    calibration = replace(batch, answer_positions=torch.tensor(local_index, dtype=torch.long))
    return RunBatch(
        input_ids=padded(packed_ids, 0, torch.long),
        calibration=calibration,
        token_weight=padded(weights, 0.0, torch.float64),
        sample_of_row=torch.arange(batch.num_samples),
        attention_mask=stack.segment_attention_mask(segment_ids, position_ids),
        position_ids=position_ids,
        gather_rows=gather_rows,
        gather_positions=gather_positions,
    )


def merge_choice_batches(batches: list[CalibrationBatch]) -> CalibrationBatch:
    """Several multiple-choice calibration batches as one (rows, items and answer indices renumbered)."""
    if len(batches) == 1:
        return batches[0]
    width = max(batch.input_ids.shape[1] for batch in batches)

    def widened(tensor, fill):
        return torch.nn.functional.pad(tensor, (0, width - tensor.shape[1]), value=fill)

    rows = items = 0
    answer_rows, sequence_item, correct = [], [], []
    for batch in batches:
        answer_rows.append(batch.answer_rows + rows)
        sequence_item.append(batch.sequence_item + items)
        correct.append(batch.correct_sequence + rows)
        rows += batch.input_ids.shape[0]
        items += batch.num_samples
    return CalibrationBatch(
        input_ids=torch.cat([widened(batch.input_ids, 0) for batch in batches]),
        token_mask=torch.cat([widened(batch.token_mask, False) for batch in batches]),
        num_samples=items,
        answer_rows=torch.cat(answer_rows),
        answer_positions=torch.cat([batch.answer_positions for batch in batches]),
        answer_tokens=torch.cat([batch.answer_tokens for batch in batches]),
        sequence_item=torch.cat(sequence_item),
        correct_sequence=torch.cat(correct),
    )


def pack_choice_batches(batches: list[CalibrationBatch], stack: BlockStack, rows: int) -> list[RunBatch]:
    """Pack multiple-choice batches with up to ``rows`` items (packed sequences) per forward.

    A calibration batch holds up to ``rows`` choice *sequences*; packed, one sequence is a whole item, so
    consecutive batches are merged until ``rows`` items share a forward (fewer, larger block calls).
    """
    groups: list[list[CalibrationBatch]] = []
    for batch in batches:
        if groups and sum(b.num_samples for b in groups[-1]) + batch.num_samples <= rows:
            groups[-1].append(batch)
        else:
            groups.append([batch])
    return [pack_choices(merge_choice_batches(group), stack) for group in groups]


def packs_choices(
    stack: BlockStack, config: CalibrationConfig, objective: Objective, *, pack_choices: bool, naive: bool
) -> bool:
    """Whether the evaluator packs each question's choices into one sequence: asked for (``pack_choices``),
    not ``naive``, a multiple-choice objective, and a model whose attention takes a 4-D mask."""
    return (
        pack_choices
        and not naive
        and objective.data_kind == MULTIPLE_CHOICE
        and stack.supports_segment_masks
        # KL over prompt and answer positions reads every position of every choice sequence
        and not config.kl_weight
    )


def run_batches_for(
    batches: list[CalibrationBatch], stack: BlockStack, packed: bool, packed_rows: int | None
) -> list[RunBatch]:
    """What the blocks run, on ``stack``'s device: the calibration ``batches`` as they are, or packed with
    up to ``packed_rows`` questions per forward (default, as many as the largest batch has sequences)."""
    if packed:
        rows = packed_rows or max(batch.input_ids.shape[0] for batch in batches)
        runs = pack_choice_batches([batch.to("cpu") for batch in batches], stack, rows)
    else:
        runs = [as_run_batch(batch) for batch in batches]
    return [run.to(stack.device) for run in runs]
