"""The torch engine's scoring minus the work that changes nothing: shared prefixes, LM head where it counts.

A naive scorer runs every request ``context + continuation`` as its own row and computes full-vocabulary
logits at every position. Evaluation asks far less:

* lm-eval sends one request per choice of a question, all with the same context: the requests of one context
  are packed into one sequence by the calibration scorer's
  :func:`~pruning.calibration.scoring.packing.pack_choices` (the shared prefix once, each choice as a branch
  with its own positions and a 4-D segment mask), so the question is computed once, not once per choice;
* only the positions predicting a scored token go through the final norm and the LM head, in chunks of
  :data:`HEAD_CHUNK_POSITIONS` (perplexity scores every position but one, so there the saving is the memory of
  ``[rows, length, vocabulary]`` logits; a question's prompt tokens are never scored).

Every log-probability is the one of the request run alone, up to float rounding (a test compares both paths on
a tiny model). Requests of one context are a group; groups are batched longest first under a token budget.
A model whose attention implementation takes no 4-D mask (flash attention) runs each request as its own row,
still with the LM head at scored positions only.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from tqdm import tqdm

from pruning.calibration.objectives.batches import CalibrationBatch
from pruning.calibration.scoring.packing import RunBatch, as_run_batch, pack_choices
from pruning.calibration.scoring.shortcuts import branch_points, shared_depth, trie_order
from pruning.model.blocks import BlockStack

Mask = tuple[int, ...]
"""A removal set as its sorted block indices (``()``: no block removed)."""

HEAD_CHUNK_POSITIONS = 1024
"""Scored positions sent through the LM head at once (bounds the ``[positions, vocabulary]`` logits)."""
MIN_WIDTH_SHARE = 0.8
"""A group joins a batch only while its packed width is at least this share of the batch's widest: padding
is at most a fifth of any row (one batch of 500 definitions of 20 to 70 tokens padded to 70 computed about
1.7 times the tokens it scored)."""


def group_by_context(contexts: Sequence[tuple[int, ...]]) -> list[list[int]]:
    """Indices of the requests grouped by identical context, groups in order of first appearance."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for index, context in enumerate(contexts):
        groups.setdefault(context, []).append(index)
    return list(groups.values())


def packed_width(group: list[int], fitted: Sequence[tuple[list[int], int]]) -> int:
    """Tokens of a group packed: its longest sequence plus every other member's scored tail (an upper
    bound on the shared-prefix layout)."""
    lengths = sorted((len(fitted[index][0]) for index in group), reverse=True)
    tails = sorted((fitted[index][1] for index in group), reverse=True)
    return lengths[0] + sum(tails[1:])


def plan_batches(
    groups: list[list[int]], fitted: Sequence[tuple[list[int], int]], batch_tokens: int
) -> list[list[list[int]]]:
    """Groups batched longest first, each batch at most ``batch_tokens`` padded tokens (one group at least) of
    groups at least :data:`MIN_WIDTH_SHARE` as wide as its widest."""
    ordered = sorted(groups, key=lambda group: -packed_width(group, fitted))
    batches: list[list[list[int]]] = []
    widest = 0
    for group in ordered:
        width = packed_width(group, fitted)
        if batches and widest * (len(batches[-1]) + 1) <= batch_tokens and width >= MIN_WIDTH_SHARE * widest:
            batches[-1].append(group)
        else:
            batches.append([group])
            widest = width
    return batches


def choice_batch(groups: list[list[int]], fitted: Sequence[tuple[list[int], int]]):
    """One :class:`CalibrationBatch` of the groups: a row per request, each group an item.

    Returns:
        ``(batch, order)``: the batch and the request index of each of its rows.
    """
    order = [index for group in groups for index in group]
    width = max(len(fitted[index][0]) for index in order)
    # padding is never attended by a real token (causal, or the segment mask), so its id does not matter
    input_ids = torch.zeros((len(order), width), dtype=torch.long)
    token_mask = torch.zeros((len(order), width), dtype=torch.bool)
    rows, positions, tokens, sequence_item, first_rows = [], [], [], [], []
    row = 0
    for item, group in enumerate(groups):
        first_rows.append(row)
        for index in group:
            ids, scored = fitted[index]
            input_ids[row, : len(ids)] = torch.tensor(ids)
            token_mask[row, : len(ids)] = True
            for position in range(len(ids) - scored, len(ids)):
                rows.append(row)
                positions.append(position - 1)  # the state at p predicts token p + 1
                tokens.append(ids[position])
            sequence_item.append(item)
            row += 1
    batch = CalibrationBatch(
        input_ids,
        token_mask,
        len(groups),
        answer_rows=torch.tensor(rows, dtype=torch.long),
        answer_positions=torch.tensor(positions, dtype=torch.long),
        answer_tokens=torch.tensor(tokens, dtype=torch.long),
        sequence_item=torch.tensor(sequence_item, dtype=torch.long),
        correct_sequence=torch.tensor(first_rows, dtype=torch.long),  # unused: no item has a right answer
    )
    return batch, order


def run_layout(batch: CalibrationBatch, stack: BlockStack) -> RunBatch:
    """Packed when some item has several rows and the attention takes a segment mask, else row per request."""
    several = batch.sequence_item.numel() > batch.num_samples
    if several and stack.supports_segment_masks:
        return pack_choices(batch, stack)
    return as_run_batch(batch)


def answer_states(run: RunBatch, hidden: torch.Tensor) -> torch.Tensor:
    """``[answer tokens, hidden]``: the last block's output at each position predicting a scored token."""
    batch = run.calibration
    rows = batch.answer_rows.to(hidden.device)
    if run.packed:
        local = batch.answer_positions.to(hidden.device)
        packed_rows = run.gather_rows.to(hidden.device)[rows, local]
        packed_positions = run.gather_positions.to(hidden.device)[rows, local]
        return hidden[packed_rows, packed_positions]
    return hidden[rows, batch.answer_positions.to(hidden.device)]


def head_scores(stack: BlockStack, run: RunBatch, hidden: torch.Tensor) -> tuple[list[float], list[bool]]:
    """Summed log-probability and greedy flag of every request row of ``run.calibration``, from the last
    block's output ``hidden`` (the LM head at the scored positions only)."""
    batch = run.calibration
    with torch.no_grad():
        states = answer_states(run, hidden)
        targets = batch.answer_tokens
        picked, hits = [], []
        for start in range(0, states.shape[0], HEAD_CHUNK_POSITIONS):
            logits = stack.head(states[start : start + HEAD_CHUNK_POSITIONS]).float()
            chunk_targets = targets[start : start + HEAD_CHUNK_POSITIONS].to(logits.device)
            logprobs = torch.log_softmax(logits, dim=-1)
            picked.append(logprobs.gather(1, chunk_targets[:, None])[:, 0].cpu())
            hits.append((logprobs.argmax(dim=-1) == chunk_targets).cpu())
    sequences = batch.input_ids.shape[0]
    rows = batch.answer_rows
    if not picked:
        return [0.0] * sequences, [True] * sequences
    # float64 sums on the CPU: the same order on every run
    totals = torch.zeros(sequences, dtype=torch.float64).index_add(0, rows, torch.cat(picked).double())
    misses = torch.zeros(sequences, dtype=torch.long).index_add(0, rows, (~torch.cat(hits)).long())
    return totals.tolist(), (misses == 0).tolist()


def walk_masks(stack: BlockStack, prepared, masks: Sequence[Mask]) -> Iterable[tuple[Mask, torch.Tensor]]:
    """Each mask's last-block output on one prepared batch, masks in trie order, shared prefixes run once.

    Args:
        stack: the dense model as blocks.
        prepared: :meth:`BlockStack.prepare` of the batch.
        masks: removal sets in :func:`~pruning.calibration.scoring.shortcuts.trie_order`.

    Yields:
        ``(mask, hidden)`` per mask, in the given order.
    """
    blocks = stack.num_blocks
    points = branch_points(list(masks), blocks)
    starts = [0] + [shared_depth(first, second, blocks) for first, second in zip(masks, masks[1:])]
    saved: dict[int, torch.Tensor] = {0: prepared.hidden}
    for mask, start, branches in zip(masks, starts, points, strict=True):
        # a later mask shares no boundary deeper than where this one leaves the previous one's path
        for boundary in [boundary for boundary in saved if boundary > start]:
            del saved[boundary]
        keep, removed = set(branches), set(mask)
        hidden = saved[start]
        for block in range(start, blocks):
            if block in keep:
                saved[block] = hidden
            if block not in removed:
                hidden = stack.run_blocks(hidden, prepared, [block])
        yield mask, hidden


def score_masks(
    stack: BlockStack,
    masks: Sequence[Mask],
    contexts: Sequence[tuple[int, ...]],
    fitted: Sequence[tuple[list[int], int]],
    batch_tokens: int,
    progress: bool = False,
) -> dict[Mask, list[tuple[float, bool]]]:
    """``(summed log-probability, greedy)`` per request for every removal set in ``masks`` (``()``: the model
    as it is), the masks walked per batch through the trie of removal sets (:func:`walk_masks`).

    Args:
        stack: the model as blocks.
        masks: removal sets, as sorted block indices.
        contexts: each request's context (requests of equal context share one packed sequence).
        fitted: each request's :func:`~pruning.evaluation.engines.fit_to_length` output ``(tokens, scored)``.
        batch_tokens: padded tokens per forward.
        progress: show a progress bar over requests (times masks).

    Returns:
        Per mask, one pair per request in the order given.
    """
    ordered = trie_order(sorted(set(masks)), stack.num_blocks)
    results = {mask: [(0.0, True)] * len(fitted) for mask in ordered}
    desc = "scoring (torch)" if len(ordered) == 1 else f"scoring {len(ordered)} masks"
    bar = tqdm(total=len(fitted) * len(ordered), desc=desc, disable=not progress, leave=False)
    for groups in plan_batches(group_by_context(contexts), fitted, batch_tokens):
        batch, order = choice_batch(groups, fitted)
        run = run_layout(batch, stack)
        with torch.no_grad():
            prepared = stack.prepare(run.input_ids, run.attention_mask, run.position_ids)
            for mask, hidden in walk_masks(stack, prepared, ordered):
                totals, greedy = head_scores(stack, run, hidden)
                scores = results[mask]
                for row, index in enumerate(order):
                    scores[index] = (totals[row], greedy[row])
                bar.update(len(order))
    bar.close()
    return results


def score_packed(
    stack: BlockStack,
    contexts: Sequence[tuple[int, ...]],
    fitted: Sequence[tuple[list[int], int]],
    batch_tokens: int,
    progress: bool = False,
) -> list[tuple[float, bool]]:
    """``(summed log-probability, greedy)`` per request of the model as it is (:func:`score_masks` with no
    block removed), in the order given."""
    return score_masks(stack, [()], contexts, fitted, batch_tokens, progress)[()]
