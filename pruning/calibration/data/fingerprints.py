"""Fingerprints of calibration items: which documents or questions a draw used, as short hashes.

A study cell records the fingerprints of its calibration items (``calibration_items``), so that anyone can
check from the JSON alone that none of them is an item of the yardstick the variants are judged on
(:func:`pruning.evaluation.yardstick.yardstick_fingerprints` hashes those the same way, and
``tests/test_calibration_items.py`` intersects the two).

What is hashed, per unit:

* ``document`` (text, ``documents`` sampling): the whole document an instance was cut from, as the source's
  split holds it: the yardstick's perplexity texts are documents too, so the same text hashes the same;
* ``question`` (multiple choice): the question (``context``), without its choices: two items asking the same
  thing count as the same item whatever their answers;
* ``window`` (text, ``stream`` sampling): the window's token ids, since a window cuts across documents; such
  fingerprints compare only with windows of the same tokenizer, which the record says by its unit.

A fingerprint is the first 16 hex digits (64 bits) of the SHA-256 of the UTF-8 text (of the JSON list of ids
for a window): at a few thousand items a chance collision has odds of about 10^-12.
"""

from __future__ import annotations

import hashlib
import json

from ground.core.objectives import TEXT
from pruning.calibration.data.items import ChoiceItem, ChoiceSamples, TextSamples

HEX_DIGITS = 16
"""Digits of SHA-256 kept per fingerprint."""


def fingerprint(text: str) -> str:
    """The fingerprint of one document's or question's text."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:HEX_DIGITS]


def question_fingerprint(item: ChoiceItem) -> str:
    """The fingerprint of a multiple-choice item: its question alone."""
    return fingerprint(item.context)


def sample_fingerprints(samples: TextSamples | ChoiceSamples, documents: list[str] | None = None) -> dict:
    """``{"unit": ..., "sha256_16": [...]}`` of drawn samples, the fingerprints sorted (a draw's order is not
    part of what it used).

    Args:
        samples: what :func:`~pruning.calibration.data.sampling.load_samples` drew.
        documents: the split's documents the ``documents`` indices point into (text drawn by document).

    Raises:
        ValueError: text drawn by document without its split's documents.
    """
    if isinstance(samples, ChoiceSamples):
        unit, found = "question", [question_fingerprint(item) for item in samples.items]
    elif samples.documents is not None:
        if documents is None:
            raise ValueError("text drawn by document needs the split's documents to be fingerprinted")
        unit, found = "document", [fingerprint(documents[index]) for index in samples.documents]
    else:
        unit, found = "window", [fingerprint(json.dumps(ids)) for ids in samples.input_ids]
    return {"unit": unit, HASHES: sorted(found)}


HASHES = "sha256_16"
"""The record's key for the fingerprints."""


def calibration_fingerprints(calibration, tokenizer, split: str = "calibration") -> dict:
    """The fingerprints of the items ``calibration`` draws (the draw the evaluator scores: same spec, samples,
    sequence length, seed and sampling, so the same items).

    Args:
        calibration: a :class:`~pruning.calibration.config.CalibrationConfig` (its ``seed`` is the draw's).
        tokenizer: the model's tokenizer (a document shorter than the sequence length is skipped).
        split: the source's split.
    """
    from pruning.calibration.data.sampling import draw_text, sample_choices
    from pruning.calibration.data.specs import load_documents, spec_kind

    if spec_kind(calibration.data) != TEXT:
        return sample_fingerprints(
            sample_choices(calibration.data, calibration.samples, calibration.seed, split)
        )
    documents = load_documents(calibration.data, split)  # once: the draw and the fingerprints both read them
    drawn = draw_text(
        documents,
        tokenizer,
        calibration.samples,
        calibration.seq_len,
        calibration.seed,
        calibration.data,
        calibration.sampling,
    )
    return sample_fingerprints(drawn, documents)


class DrawFingerprints:
    """:func:`calibration_fingerprints` with each draw made once: the cells of a study share a draw whatever
    their search or M (what decides the items is the data spec, samples, sequence length, seed and
    sampling)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.drawn: dict[tuple, dict] = {}

    def __call__(self, calibration) -> dict:
        key = (
            calibration.data,
            calibration.samples,
            calibration.seq_len,
            calibration.seed,
            calibration.sampling,
        )
        if key not in self.drawn:
            self.drawn[key] = calibration_fingerprints(calibration, self.tokenizer)
        return self.drawn[key]
