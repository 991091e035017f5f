"""Scoring requests for the evaluation engines' tests: questions with shared contexts, lone requests and long
perplexity windows, in the tiny models' vocabulary."""

from __future__ import annotations

import random

from pruning.evaluation.engines import ScoreRequest


def mixed_requests(seed: int = 0) -> list[ScoreRequest]:
    """Questions with 2-4 choices (some sharing answer tokens), lone requests and long perplexity windows."""
    rng = random.Random(seed)

    def words(count: int) -> tuple[int, ...]:
        return tuple(rng.randrange(4, 256) for _ in range(count))

    requests = []
    for _ in range(12):
        context = (1, *words(rng.randrange(1, 40)))
        shared = words(rng.randrange(0, 3))  # choices that begin alike share more than the context
        requests += [
            ScoreRequest(context, shared + words(rng.randrange(1, 5))) for _ in range(rng.randint(2, 4))
        ]
    requests += [ScoreRequest((1,), words(rng.randrange(2, 30))) for _ in range(5)]
    requests += [ScoreRequest((2,), words(299))]  # longer than the context: cut on the left
    rng.shuffle(requests)
    return requests
