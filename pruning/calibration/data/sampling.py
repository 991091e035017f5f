"""Drawing calibration samples from a source: text instances (``documents`` or ``stream``) or questions.

Text samples (``sampling``, :data:`~pruning.calibration.data.items.SAMPLINGS`):

* ``documents`` (the default, the study's and SLEB's way): one document per instance. Documents are visited
  in an order shuffled with the seed; each is tokenized as the model reads a sequence (with the tokenizer's
  special tokens, e.g. Llama's BOS), a document shorter than ``seq_len`` tokens is skipped (and counted), a
  longer one is truncated to its first ``seq_len`` tokens, until ``samples`` instances are taken. SLEB's C4
  loader draws random documents the same way; the study takes 64 instances truncated to 2048 tokens.
* ``stream`` (SparseGPT's windows, the earlier default): documents shuffled with the seed, tokenized without
  special tokens and concatenated (the EOS token between documents), the stream cut into non-overlapping
  windows of ``seq_len`` tokens, ``samples`` of them drawn at random with the seed.

The same seed gives the same samples. Multiple-choice items are drawn at random (without replacement) with the
seed.
"""

from __future__ import annotations

import random

from ground.core.errors import UserError
from pruning.calibration.data.items import SAMPLINGS, TEXT, ChoiceSamples, TextSamples
from pruning.calibration.data.specs import load_choice_items, load_documents, parse_spec


def tokenize_stream(documents: list[str], tokenizer) -> list[int]:
    """Token ids of the documents concatenated, the EOS token (when the tokenizer has one) between them."""
    separator = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    stream: list[int] = []
    for document in documents:
        if stream:
            stream.extend(separator)
        stream.extend(tokenizer(document, add_special_tokens=False)["input_ids"])
    return stream


FIRST_GUESS_CHARS_PER_TOKEN = 8
""":func:`tokenize_stream_prefix` first tokenises this many characters per token wanted (text runs about 4),
and four times more each time that was not enough."""
STABLE_TOKENS = 16
"""Tokens past the ones wanted that a cut prefix must give, so that the text cut off cannot change them."""


def text_prefix(documents: list[str], chars: int) -> tuple[list[str], bool]:
    """The documents in order up to about ``chars`` characters, the last cut after a whitespace where it can
    be; and whether anything was left out."""
    prefix, total = [], 0
    for document in documents:
        if total + len(document) <= chars:
            prefix.append(document)
            total += len(document) + 1
            continue
        head = document[: max(0, chars - total)]
        space = max(head.rfind(" "), head.rfind("\n"), head.rfind("\t"))
        head = head[: space + 1] if space > 0 else head
        if head:
            prefix.append(head)
        return prefix, True
    return prefix, False


def tokenize_stream_prefix(documents: list[str], tokenizer, tokens: int) -> list[int]:
    """At least the first ``tokens`` ids of :func:`tokenize_stream` (all of them when there are fewer), from
    a prefix of the text: a 50 MB document is not tokenised whole for a few windows. The prefix grows
    fourfold until it gives ``tokens`` plus :data:`STABLE_TOKENS` ids, so the ids kept are those the whole
    text gives, and the work stays within a small multiple of what the ids need."""
    chars = max(1, tokens * FIRST_GUESS_CHARS_PER_TOKEN)
    while True:
        prefix, cut = text_prefix(documents, chars)
        stream = tokenize_stream(prefix, tokenizer)
        if not cut:
            return stream
        if len(stream) >= tokens + STABLE_TOKENS:
            return stream[:tokens]
        chars *= 4


def text_windows(documents: list[str], tokenizer, seq_len: int) -> list[list[int]]:
    """Every non-overlapping ``seq_len`` window of the documents' token stream, in order (for perplexity)."""
    stream = tokenize_stream(documents, tokenizer)
    return [stream[start : start + seq_len] for start in range(0, len(stream) - seq_len + 1, seq_len)]


def sample_documents(
    documents: list[str], tokenizer, samples: int, seq_len: int, seed: int, spec: str = "text"
) -> TextSamples:
    """``samples`` documents, one per instance, each truncated to ``seq_len`` tokens (the study's way).

    Documents are visited in an order shuffled with ``seed`` and tokenized with the tokenizer's special tokens
    (as the model reads a sequence); one shorter than ``seq_len`` tokens is skipped and counted.

    Raises:
        UserError: fewer than ``samples`` documents have ``seq_len`` tokens; names how many were skipped.
    """
    order = list(range(len(documents)))
    random.Random(seed).shuffle(order)
    taken: list[list[int]] = []
    indices: list[int] = []
    skipped = 0
    for index in order:
        # verbose=False: documents longer than the model's context are expected; they are truncated here.
        ids = tokenizer(documents[index], verbose=False)["input_ids"]
        if len(ids) < seq_len:
            skipped += 1
            continue
        taken.append(list(ids[:seq_len]))
        indices.append(index)
        if len(taken) == samples:
            break
    if len(taken) < samples:
        raise UserError(
            f"data {spec!r} has only {len(taken)} documents of at least {seq_len} tokens ({skipped} of its "
            f"{len(documents)} documents are shorter and were skipped), fewer than the {samples} samples "
            f"asked for: lower --samples or --seq-len, or cut windows from the joined text with "
            f"--sampling stream"
        )
    return TextSamples(taken, spec, "documents", skipped, indices)


def sample_stream_windows(
    documents: list[str], tokenizer, samples: int, seq_len: int, seed: int, spec: str = "text"
) -> TextSamples:
    """``samples`` random windows of ``seq_len`` tokens of the documents joined (SparseGPT's windows).

    Raises:
        UserError: the documents have fewer than ``samples`` windows of that length.
    """
    rng = random.Random(seed)
    order = list(range(len(documents)))
    rng.shuffle(order)
    # Large corpora (C4) are not tokenized whole: documents are taken in shuffled order until a generous
    # character-based estimate (>= 2 chars per token) covers 8x the tokens the draw needs.
    needed = samples * seq_len
    chosen, approx_tokens = [], 0
    for index in order:
        chosen.append(documents[index])
        approx_tokens += len(documents[index]) // 2 + 1
        if approx_tokens >= 8 * needed:
            break
    windows = text_windows(chosen, tokenizer, seq_len)
    if len(windows) < samples and len(chosen) < len(documents):  # the estimate was off: use everything
        windows = text_windows([documents[index] for index in order], tokenizer, seq_len)
    if len(windows) < samples:
        raise UserError(
            f"data {spec!r} has only {len(windows)} windows of {seq_len} tokens, fewer than the "
            f"{samples} samples asked for: lower the samples or the sequence length"
        )
    picked = sorted(rng.sample(range(len(windows)), samples))
    return TextSamples([windows[index] for index in picked], spec, "stream")


def sample_text(
    spec: str,
    tokenizer,
    samples: int,
    seq_len: int,
    seed: int,
    split: str = "calibration",
    sampling: str = "documents",
) -> TextSamples:
    """``samples`` instances of ``seq_len`` tokens of a text source, deterministic in ``seed``.

    Args:
        spec: a text data spec.
        tokenizer: the model's tokenizer.
        samples: instances to draw.
        seq_len: tokens per instance.
        seed: seed of the draw.
        split: the source's split.
        sampling: ``documents`` (one document per instance, the default) or ``stream`` (windows of the joined
            documents); see the module docstring.

    Raises:
        UserError: an unknown sampling, or too little text for the draw.
    """
    if sampling not in SAMPLINGS:
        raise UserError(f"unknown sampling {sampling!r}; use one of {', '.join(SAMPLINGS)}")
    return draw_text(load_documents(spec, split), tokenizer, samples, seq_len, seed, spec, sampling)


def draw_text(
    documents: list[str], tokenizer, samples: int, seq_len: int, seed: int, spec: str, sampling: str
) -> TextSamples:
    """:func:`sample_text`'s draw from a split's documents already loaded (``sampling`` one of
    :data:`SAMPLINGS`), for a caller that needs the documents too."""
    draw = sample_documents if sampling == "documents" else sample_stream_windows
    return draw(documents, tokenizer, samples, seq_len, seed, spec)


def sample_choices(spec: str, samples: int, seed: int, split: str = "calibration") -> ChoiceSamples:
    """``samples`` random items of a multiple-choice source, deterministic in ``seed``.

    Raises:
        UserError: the source has fewer than ``samples`` items.
    """
    items = load_choice_items(spec, split)
    if len(items) < samples:
        raise UserError(
            f"data {spec!r} has only {len(items)} items, fewer than the {samples} samples "
            f"asked for: lower the samples"
        )
    picked = sorted(random.Random(seed).sample(range(len(items)), samples))
    return ChoiceSamples([items[index] for index in picked], spec)


def load_samples(
    spec: str,
    tokenizer,
    samples: int,
    seq_len: int,
    seed: int,
    split: str = "calibration",
    sampling: str = "documents",
) -> TextSamples | ChoiceSamples:
    """Resolve a spec to calibration samples of its kind (text instances or multiple-choice items).

    ``sampling`` applies to text only (:func:`sample_text`).
    """
    if parse_spec(spec).kind == TEXT:
        return sample_text(spec, tokenizer, samples, seq_len, seed, split, sampling)
    return sample_choices(spec, samples, seed, split)
