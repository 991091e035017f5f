"""The calibration instances exactly as an objective sees them, for ``depthprune data show``.

The same draw as a pruning run (:func:`pruning.calibration.data.sampling.load_samples` with the same spec,
sample count, sequence length, seed and sampling), the same tokenizer, and the same encoding: a text instance
is the token ids the perplexity and KL objectives score, decoded back to text (special tokens kept); a
multiple-choice item carries, per choice, the exact prompt and the exact answer tokens the task margin scores
(:func:`pruning.calibration.objectives.batches.encode_choice`, prompt truncation included), decoded. So what
is printed is what calibrates the pruning, before any search is paid for.
"""

from __future__ import annotations

from dataclasses import dataclass

from pruning.calibration.data.items import ChoiceSamples, TextSamples
from pruning.calibration.data.sampling import load_samples
from pruning.calibration.objectives.batches import encode_choice


@dataclass
class ShownInstances:
    """The drawn instances as JSON-ready dicts, and what the draw says about itself."""

    instances: list[dict]
    """One dict per instance: ``{"text", "tokens", "document"}``, or ``{"context", "choices", "label",
    "scoring", "scored"}``."""
    kind: str
    """``text`` or ``multiple_choice``."""
    summary: str
    """One line: how many, from where, how drawn (documents skipped included)."""


def describe_text(samples: TextSamples, tokenizer) -> list[dict]:
    """Each text instance: its decoded tokens, its length, and the index of its document (``documents``)."""
    documents = samples.documents or [None] * len(samples.input_ids)
    return [
        {"text": tokenizer.decode(ids, skip_special_tokens=False), "tokens": len(ids), "document": document}
        for ids, document in zip(samples.input_ids, documents, strict=True)
    ]


def describe_choices(samples: ChoiceSamples, tokenizer, seq_len: int) -> list[dict]:
    """Each item: context, choices, label, scoring, and per choice the scored prompt and answer, decoded."""
    described = []
    for item in samples.items:
        scored = []
        for choice in item.choices:
            ids, start, _ = encode_choice(
                tokenizer, item.context, choice, seq_len, item.scoring, truncate=True
            )
            scored.append(
                {
                    "prompt": tokenizer.decode(ids[:start], skip_special_tokens=False),
                    "answer": tokenizer.decode(ids[start:], skip_special_tokens=False),
                }
            )
        described.append(
            {
                "context": item.context,
                "choices": list(item.choices),
                "label": item.label,
                "scoring": item.scoring,
                "scored": scored,
            }
        )
    return described


def show_instances(
    spec: str,
    tokenizer,
    samples: int,
    seq_len: int,
    seed: int = 0,
    sampling: str = "documents",
    split: str = "calibration",
) -> ShownInstances:
    """Draw a spec's calibration instances as a pruning run would and describe them.

    Args:
        spec: a data spec (:mod:`pruning.calibration.data`).
        tokenizer: the model's tokenizer.
        samples: instances to draw.
        seq_len: tokens per text instance; the longest a prompt plus answer may be.
        seed: the data seed (``prune --data-seed``).
        sampling: text sampling, ``documents`` or ``stream``.
        split: the source's split.

    Returns:
        The instances and a one-line summary.
    """
    drawn = load_samples(spec, tokenizer, samples, seq_len, seed, split, sampling)
    if isinstance(drawn, TextSamples):
        skipped = f"; {drawn.skipped} shorter documents skipped" if drawn.sampling == "documents" else ""
        summary = (
            f"{len(drawn.input_ids)} text instances of {seq_len} tokens from {spec} ({split}, "
            f"{drawn.sampling} sampling, seed {seed}{skipped})"
        )
        return ShownInstances(describe_text(drawn, tokenizer), drawn.kind, summary)
    summary = f"{len(drawn.items)} multiple-choice items from {spec} ({split}, seed {seed})"
    return ShownInstances(describe_choices(drawn, tokenizer, seq_len), drawn.kind, summary)
