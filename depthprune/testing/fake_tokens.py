"""Token ids and prompt log-probabilities of the fake vLLM server (:mod:`depthprune.testing.fake_vllm`).

Enough of vLLM's ``return_token_ids`` and ``prompt_logprobs`` for the gateway's shadow scoring to be tested
without an engine, with a known answer: a fake model's generated ids carry the model's name in their high
digits, and a fake model scoring a sequence gives its own tokens log-probability about -0.75 (rank 1) and
anyone else's about -1.75 (rank 3). So an arm served by another model than the control is 1 nat per token
worse under it, with per-request spread, and an A/A arm (the same model) is no worse.
"""

from __future__ import annotations

import zlib

BLOCK = 10_000
"""Ids of one fake model lie in one block of this many."""
OTHER_MODEL_PENALTY = 1.0
"""Nats per token a fake model loses on another model's tokens."""


def _hash(text: str) -> int:
    return zlib.crc32(text.encode())


def prompt_ids(prompt) -> list[int]:
    """The ids of a prompt: a token list as it is, a text word by word."""
    if isinstance(prompt, list) and all(isinstance(token, int) for token in prompt):
        return list(prompt)
    return [_hash(word) % BLOCK for word in str(prompt).split()]


def generated_ids(served_model: str, prompt, count: int) -> list[int]:
    """The ids of ``count`` generated tokens: in the model's block, varying with the prompt."""
    block = (_hash(served_model) % 100 + 1) * BLOCK
    seed = _hash(str(prompt))
    return [block + (seed + 7919 * i) % BLOCK for i in range(count)]


def prompt_logprobs(served_model: str, ids: list[int]) -> list:
    """vLLM's ``prompt_logprobs`` of ``ids`` under ``served_model``: None first, then the token at each
    position with its log-probability and rank."""
    own_block = _hash(served_model) % 100 + 1
    entries: list = [None]
    for token in ids[1:]:
        spread = (_hash(str(token)) % 1000) / 1000 * 0.5  # per-token noise in [0, 0.5)
        own = token // BLOCK == own_block
        logprob = -(0.5 + spread) - (0 if own else OTHER_MODEL_PENALTY)
        entries.append({str(token): {"logprob": logprob, "rank": 1 if own else 3, "decoded_token": "w"}})
    return entries
