"""Masks judged from the dense weights (:mod:`pruning.evaluation.mask_set`): the same scores as each pruned
checkpoint, every shared block prefix run once."""

from __future__ import annotations

import pytest

from depthprune.testing.requests import mixed_requests
from pruning.calibration.scoring.shortcuts import trie_order
from pruning.evaluation.engines import TorchEngine, fit_to_length
from pruning.evaluation.mask_set import MaskSetEngine
from pruning.evaluation.packed_scoring import (
    choice_batch,
    group_by_context,
    head_scores,
    plan_batches,
    run_layout,
    score_masks,
)

MASKS = [(0, 1), (0, 2), (1, 2), (1, 3), (2, 5), (3, 4), (3,), (), (0, 1, 2), (4, 5)]
"""Masks of the six-block tiny model sharing prefixes of every depth, the dense model among them."""
BLOCKS = 6


@pytest.mark.parametrize("architecture", ["llama", "gemma3_text"])
def test_each_mask_scores_what_its_pruned_checkpoint_scores(tiny_model_dirs, tmp_path, architecture):
    from pruning.model.checkpoint import write_pruned_checkpoint

    dense = str(tiny_model_dirs(architecture))
    requests = mixed_requests()
    engine = MaskSetEngine(dense, MASKS, batch_tokens=300)
    for mask in MASKS[:3] + [()]:
        directory = dense if not mask else write_pruned_checkpoint(dense, mask, tmp_path / str(mask)).path
        alone = TorchEngine(str(directory), batch_tokens=300).score(requests)
        together = engine.view(mask).score(requests)
        for mine, theirs in zip(together, alone, strict=True):
            assert mine.tokens == theirs.tokens and mine.is_greedy == theirs.is_greedy
            assert mine.logprob == pytest.approx(theirs.logprob, rel=1e-5, abs=1e-4)
    engine.close()


def test_the_walk_equals_each_mask_run_alone_bit_for_bit_and_shares_prefixes(tiny_model_dirs):
    stack = TorchEngine(str(tiny_model_dirs("llama")))._block_stack()
    requests = mixed_requests(seed=3)
    fitted = [fit_to_length(request, 4096) for request in requests]
    contexts = [request.context for request in requests]
    forwards = []
    run_blocks = stack.run_blocks
    stack.run_blocks = lambda hidden, batch, indices: (
        forwards.append(len(indices)) or run_blocks(hidden, batch, indices)
    )
    together = score_masks(stack, MASKS, contexts, fitted, batch_tokens=100_000)
    walked, forwards[:] = sum(forwards), []
    for mask in MASKS:
        assert alone(stack, mask, contexts, fitted) == together[mask]
    # per batch, one forward per node of the trie, not one per kept block of every mask
    batches = len(plan_batches(group_by_context(contexts), fitted, 100_000))
    kept = sum(BLOCKS - len(mask) for mask in MASKS)
    assert sum(forwards) == kept * batches
    assert walked == len(_trie_nodes()) * batches < kept * batches
    assert list(together) == trie_order(sorted(set(MASKS)), BLOCKS)


def alone(stack, mask, contexts, fitted) -> list[tuple[float, bool]]:
    """The mask scored by itself, the same batches through ``final_hidden`` with that removal set."""
    scores = [(0.0, True)] * len(fitted)
    for groups in plan_batches(group_by_context(contexts), fitted, 100_000):
        batch, order = choice_batch(groups, fitted)
        run = run_layout(batch, stack)
        hidden = stack.final_hidden(run.input_ids, mask, run.attention_mask, run.position_ids)
        totals, greedy = head_scores(stack, run, hidden)
        for row, index in enumerate(order):
            scores[index] = (totals[row], greedy[row])
    return scores


def _trie_nodes() -> set[tuple[int, tuple[int, ...]]]:
    """(block, removed blocks below it) of every block some mask runs: the forwards a trie walk needs."""
    return {
        (block, tuple(r for r in mask if r < block))
        for mask in MASKS
        for block in range(BLOCKS)
        if block not in mask
    }


def test_a_mask_outside_the_engine_or_the_model_is_refused(tiny_model_dirs):
    from ground.core.errors import UserError

    with pytest.raises(UserError, match="6"):
        MaskSetEngine(str(tiny_model_dirs("llama")), [(6,)])
    engine = MaskSetEngine(str(tiny_model_dirs("llama")), [(1,)])
    with pytest.raises(ValueError, match="not one of"):
        engine.view((2,))
    with pytest.raises(UserError, match="scores only"):
        engine.view((1,)).generate([[1, 2]], max_tokens=2)
    engine.close()


def test_the_walks_saved_states_are_sized_to_the_free_memory():
    """On a GPU the walk keeps up to one hidden state per block: Llama-3.1-8B's 32 blocks of 4,096 bfloat16
    at 16,384 tokens would hold 4 GiB; with 10 GiB free (a quarter for the states) the batch halves to
    8,192."""
    from types import SimpleNamespace

    import torch

    from pruning.evaluation.mask_set import state_budget_tokens

    stack = SimpleNamespace(
        num_blocks=32,
        config=SimpleNamespace(hidden_size=4096),
        lm_head=SimpleNamespace(weight=torch.empty(0, dtype=torch.bfloat16)),
    )
    assert state_budget_tokens(stack, 16384, 10 * 2**30) == 8192
    assert state_budget_tokens(stack, 16384, 80 * 2**30) == 16384
    assert state_budget_tokens(stack, 16384, 2**20) == 256  # never below one short batch
