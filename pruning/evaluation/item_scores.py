"""Per-item scores kept with every result, so that intervals and pairing can be computed at any time.

Each :class:`~pruning.evaluation.suites.EvalResult` carries ``settings["statistics"]``: its interval fields
(:func:`pruning.evaluation.intervals.interval_record`) and ``items``, the per-item scores in a compact form
keyed by item identity:

* accuracy: ``{"keys": [...], "correct": "0110..."}`` — one character per item;
* perplexity: ``{"keys": [...], "nll": [...], "tokens": [...]}`` — per window, the summed NLL and tokens.

A key is the first 12 hex digits of the sha256 of what the item is (an lm-eval document, a user question,
a window's token ids); a repeated item gets ``#2``, ``#3``... so that every key is unique. Two results
pair when their key sets are equal, whichever run, order or machine measured them
(:mod:`pruning.evaluation.paired`).
The registry stores ``statistics`` with the result and leaves it out of the result's identity.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence

from pruning.evaluation.intervals import accuracy_interval, interval_record, perplexity_interval

KEY_DIGITS = 12
"""Hex digits of an item key (48 bits: no collision among millions of items)."""


def content_key(content) -> str:
    """The key of an item: sha256 of its canonical JSON (or of a string as it is), first digits."""
    text = content if isinstance(content, str) else json.dumps(content, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:KEY_DIGITS]


def unique_keys(keys: Iterable[str]) -> list[str]:
    """``keys`` with the second and later copies of a key numbered (``abc#2``): every key unique."""
    seen: dict[str, int] = {}
    unique = []
    for key in keys:
        seen[key] = seen.get(key, 0) + 1
        unique.append(key if seen[key] == 1 else f"{key}#{seen[key]}")
    return unique


def accuracy_statistics(keys: Sequence[str], correct: Sequence[float]) -> dict:
    """``statistics`` of an accuracy: its interval fields and the per-item correctness."""
    keys = unique_keys(keys)
    bits = "".join("1" if value >= 0.5 else "0" for value in correct)
    return {
        **interval_record(accuracy_interval([int(bit) for bit in bits]), "accuracy"),
        "items": {"keys": keys, "correct": bits},
    }


def perplexity_statistics(keys: Sequence[str], nll: Sequence[float], tokens: Sequence[int]) -> dict:
    """``statistics`` of a perplexity: its interval fields, tokens, and the per-window NLL and tokens."""
    keys = unique_keys(keys)
    return {
        **interval_record(perplexity_interval(nll, tokens), "perplexity"),
        "tokens": int(sum(tokens)),
        "items": {"keys": keys, "nll": [float(value) for value in nll], "tokens": [int(t) for t in tokens]},
    }


def window_key(window: Sequence[int]) -> str:
    """The key of a perplexity window: its token ids."""
    return content_key(",".join(map(str, window)))


def summary(statistics: dict) -> dict:
    """``statistics`` without the per-item scores (what ``--json`` and tables show)."""
    return {key: value for key, value in statistics.items() if key != "items"}
