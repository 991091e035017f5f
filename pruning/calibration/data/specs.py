"""Data spec strings: parsed without reading anything, and resolved to a split's documents or items.

A spec names a source of :data:`~pruning.calibration.data.sources.SOURCES` (``c4``, ``demo:qa``), optionally
with a path (``text:PATH``, ``mc:PATH``, ``commonsense170k:PATH``) or a directory (``demo:text@DIR``,
``commonsense170k@PATH``). Splits: ``calibration`` and ``test`` for every source (a local file gives the
whole file for either), ``heal`` for the sources with one.
"""

from __future__ import annotations

from ground.core.errors import UserError
from pruning.calibration.data.items import MULTIPLE_CHOICE, SPLITS, TEXT, ChoiceItem, DataSpec
from pruning.calibration.data.sources import HEAL_SOURCES, SOURCES, known_specs


def parse_spec(spec: str) -> DataSpec:
    """Parse a data spec string without reading anything.

    Raises:
        UserError: the spec names no known source, or a path spec has no path.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise UserError(f"empty data spec; use one of: {known_specs()}")
    spec = spec.strip()
    for name, source in SOURCES.items():
        prefix = f"{name}:"
        if source.path_prefix and spec.startswith(prefix):
            path = spec[len(prefix) :]
            if not path:
                raise UserError(f"data spec {spec!r} needs a file path, e.g. {prefix}calibration.jsonl")
            return DataSpec(spec, name, source.kind, path)
    name, _, path = spec.partition("@")
    source = SOURCES.get(name)
    if source is None or source.needs_path:
        raise UserError(f"unknown data spec {spec!r}; use one of: {known_specs()}")
    if "@" in spec and not path:
        raise UserError(f"data spec {spec!r} has an empty path after '@'")
    if path and not source.at_path:
        raise UserError(f"data spec {name!r} takes no '@PATH'")
    return DataSpec(spec, name, source.kind, path or None)


def spec_kind(spec: str) -> str:
    """``"text"`` or ``"multiple_choice"`` for a spec string (no data is read)."""
    return parse_spec(spec).kind


def has_heal_split(spec: str) -> bool:
    """Whether the spec's source has a ``heal`` split (no data is read)."""
    return parse_spec(spec).source in HEAL_SOURCES


def _check_split(parsed: DataSpec, split: str) -> None:
    if split not in SPLITS:
        raise UserError(f"unknown split {split!r}; use one of {', '.join(SPLITS)}")
    if split == "heal" and parsed.source not in HEAL_SOURCES:
        with_heal = ", ".join(form for name in HEAL_SOURCES for form in SOURCES[name].spec_forms)
        raise UserError(f"data {parsed.spec!r} has no 'heal' split; sources with one: {with_heal}")


def load_documents(spec: str, split: str = "calibration") -> list[str]:
    """All documents of a text source's split."""
    parsed = parse_spec(spec)
    _check_split(parsed, split)
    if parsed.kind != TEXT:
        raise UserError(f"data {spec!r} is multiple-choice, not text")
    documents = [document for document in SOURCES[parsed.source].read(parsed, split) if document.strip()]
    if not documents:
        raise UserError(f"data {spec!r} ({split}) has no text")
    return documents


def load_choice_items(spec: str, split: str = "calibration") -> list[ChoiceItem]:
    """All items of a multiple-choice source's split (Commonsense-170k has only its training file)."""
    parsed = parse_spec(spec)
    _check_split(parsed, split)
    if parsed.kind != MULTIPLE_CHOICE:
        raise UserError(f"data {spec!r} is text, not multiple-choice")
    return SOURCES[parsed.source].read(parsed, split)
