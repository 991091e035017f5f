"""Held-out data for selecting among a run's outcomes: ``prune --validation SPEC``, or the default split.

The **default validation data** is the calibration source's own ``calibration`` split minus the calibration
draw, so it is disjoint from the calibration samples and, like them, from every ``test`` split (the sources
keep their splits apart):

* multiple choice: up to ``samples`` items drawn with the seed from the items the calibration draw left;
* text (``documents`` sampling): the next (up to) ``samples`` documents of at least ``seq_len`` tokens in the
  calibration draw's shuffled order (each, like a calibration instance, its first ``seq_len`` tokens);
* text (``stream`` sampling): no default (a window draw has no natural remainder): pass ``--validation``.

An explicit ``--validation SPEC`` (of the objective's data kind) is drawn from that source's ``calibration``
split with the seed (``mc:PATH`` and ``text:PATH`` files are one split): up to ``samples`` items, or
``samples`` text instances.
"""

from __future__ import annotations

import random

from ground.core.errors import UserError
from pruning.calibration.data.items import TEXT, ChoiceSamples, TextSamples
from pruning.calibration.data.sampling import sample_text
from pruning.calibration.data.specs import load_choice_items, load_documents, parse_spec

LOCAL_SOURCES = ("text", "mc")
"""Sources read from a local file: checked by :func:`check_validation_data` before any model loads."""


def check_validation_data(config, spec: str | None = None) -> None:
    """Refuse, before any model loads, validation data that :func:`validation_samples` would refuse later.

    A ``--validation`` of the wrong kind, ``stream`` sampling without one, and a local ``text:`` / ``mc:``
    file whose calibration draw leaves nothing to validate on (no more items, or documents, than
    ``--samples``). Other sources are large; they are checked when drawn.

    Raises:
        UserError: what :func:`validation_samples` would raise, in the same words.
    """
    if spec is not None and spec != config.data:
        if parse_spec(spec).kind != config.kind:
            raise UserError(
                f"--validation {spec!r} is {parse_spec(spec).kind.replace('_', '-')} data; objective "
                f"{config.objective!r} needs {config.kind.replace('_', '-')} data"
            )
        return
    if config.kind == TEXT and config.sampling != "documents":
        raise UserError("text drawn with --sampling stream has no default validation data: pass --validation")
    if parse_spec(config.data).source not in LOCAL_SOURCES:
        return
    if config.kind != TEXT:
        if len(load_choice_items(config.data, "calibration")) <= config.samples:
            raise _nothing_left(config.data, "items", config.samples)
    elif len(load_documents(config.data, "calibration")) <= config.samples:
        raise _nothing_left(config.data, "documents", config.samples)


def _nothing_left(spec: str, what: str, samples: int) -> UserError:
    return UserError(
        f"data {spec!r} has no {what} left after the calibration draw to validate on (--samples {samples} "
        f"takes them all): pass --validation SPEC or lower --samples"
    )


def _held_out_items(spec: str, samples: int, seed: int) -> ChoiceSamples:
    items = load_choice_items(spec, "calibration")
    picked = set(random.Random(seed).sample(range(len(items)), min(samples, len(items))))
    rest = [index for index in range(len(items)) if index not in picked]
    if not rest:
        raise UserError(
            f"data {spec!r} has no items left after the calibration draw to validate on: "
            "pass --validation SPEC"
        )
    chosen = sorted(random.Random(seed + 1).sample(rest, min(samples, len(rest))))
    return ChoiceSamples([items[index] for index in chosen], f"{spec} (held out)")


def _held_out_documents(spec: str, tokenizer, samples: int, seq_len: int, seed: int) -> TextSamples:
    documents = load_documents(spec, "calibration")
    order = list(range(len(documents)))
    random.Random(seed).shuffle(order)  # the calibration draw's order (sampling.sample_documents)
    long_enough = []
    for index in order:
        ids = tokenizer(documents[index], verbose=False)["input_ids"]
        if len(ids) >= seq_len:
            long_enough.append((index, list(ids[:seq_len])))
        if len(long_enough) == 2 * samples:
            break
    held_out = long_enough[samples:]
    if not held_out:
        raise UserError(
            f"data {spec!r} has no document of {seq_len} tokens left after the calibration draw to validate "
            f"on: pass --validation SPEC or lower --samples"
        )
    return TextSamples(
        [ids for _, ids in held_out], f"{spec} (held out)", "documents", documents=[i for i, _ in held_out]
    )


def default_validation_data(config) -> str:
    """How a quality record names the default validation data of ``config`` (``validation_data``)."""
    return f"{config.data} (held-out part of its calibration split)"


def validation_spec(config, validation_data: str | None) -> str | None:
    """The ``--validation`` spec a recorded ``validation_data`` of ``config`` was drawn with: None for the
    default data (:func:`default_validation_data`), else the spec itself (:func:`validation_samples` names
    an explicit spec by itself)."""
    return None if validation_data in (None, default_validation_data(config)) else validation_data


def validation_samples(config, tokenizer, spec: str | None = None) -> tuple[str, TextSamples | ChoiceSamples]:
    """``(what, samples)``: the validation data of a calibration configuration (module docstring).

    Raises:
        UserError: a spec of the wrong kind, or too little data.
    """
    if spec is not None and spec != config.data:
        if parse_spec(spec).kind != config.kind:
            raise UserError(
                f"--validation {spec!r} is {parse_spec(spec).kind.replace('_', '-')} data; objective "
                f"{config.objective!r} needs {config.kind.replace('_', '-')} data"
            )
        if config.kind == TEXT:
            return spec, sample_text(spec, tokenizer, config.samples, config.seq_len, config.seed)
        items = load_choice_items(spec, "calibration")
        picked = sorted(random.Random(config.seed).sample(range(len(items)), min(config.samples, len(items))))
        return spec, ChoiceSamples([items[index] for index in picked], spec)
    what = default_validation_data(config)
    if config.kind != TEXT:
        return what, _held_out_items(config.data, config.samples, config.seed)
    if config.sampling != "documents":
        raise UserError("text drawn with --sampling stream has no default validation data: pass --validation")
    return what, _held_out_documents(config.data, tokenizer, config.samples, config.seq_len, config.seed)
