"""The torch engine's packed scoring (shared prefixes, LM head at scored positions) equals the naive path."""

from __future__ import annotations

import pytest

from depthprune.testing.requests import mixed_requests
from pruning.evaluation.engines import TorchEngine
from pruning.evaluation.packed_scoring import group_by_context, plan_batches


@pytest.mark.parametrize("architecture", ["llama", "qwen3", "gemma3_text"])
@pytest.mark.parametrize("batch_tokens", [16384, 200])
def test_packed_scores_equal_naive(tiny_model_dirs, architecture, batch_tokens):
    engine = TorchEngine(str(tiny_model_dirs(architecture)), batch_tokens=batch_tokens)
    requests = mixed_requests()
    packed = engine.score(requests)
    engine.naive = True
    naive = engine.score(requests)
    for fast, slow in zip(packed, naive, strict=True):
        assert fast.tokens == slow.tokens
        assert fast.logprob == pytest.approx(slow.logprob, rel=1e-5, abs=1e-4)
        assert fast.is_greedy == slow.is_greedy


def test_requests_of_one_context_share_a_sequence():
    contexts = [(1, 5), (1, 6), (1, 5), (1, 5), (1, 6), (7,)]
    assert group_by_context(contexts) == [[0, 2, 3], [1, 4], [5]]
    fitted = [([1, 5, 9], 1)] * 4 + [([1, 6, 9, 9], 2)] * 2
    batches = plan_batches([[0, 2, 3], [1, 4], [5]], fitted, batch_tokens=10)
    assert sorted(index for batch in batches for group in batch for index in group) == list(range(6))
    assert all(len(batch) >= 1 for batch in batches)
