"""Local files: ``text:PATH`` (``.txt``, one document per non-blank line, or ``.jsonl``, one per record's
``text`` field) and ``mc:PATH`` (a JSONL of ``{"context", "choices", "label"}``, optionally ``"scoring"``).

Both give the whole file for every split, ``heal`` included.
"""

from __future__ import annotations

import json
from pathlib import Path

from depthprune.core.errors import UserError
from pruning.calibration.data.items import (
    ANSWER_SCORING,
    MULTIPLE_CHOICE,
    SCORINGS,
    TEXT,
    ChoiceItem,
    DataSpec,
    Source,
)


def read_jsonl(path: Path) -> list[tuple[int, dict]]:
    if not path.is_file():
        raise UserError(f"data file {str(path)!r} does not exist")
    rows = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise UserError(f"{path}:{number}: not valid JSON ({error.msg})") from None
            if not isinstance(row, dict):
                raise UserError(f"{path}:{number}: expected a JSON object per line")
            rows.append((number, row))
    return rows


def read_text_file(path: str | Path) -> list[str]:
    """Documents of a local text source: one per JSONL record (its ``text`` field) or per non-blank line."""
    path = Path(path).expanduser()
    if path.suffix == ".jsonl":
        documents = []
        for number, row in read_jsonl(path):
            if not isinstance(row.get("text"), str):
                raise UserError(f"{path}:{number}: expected a string field 'text'")
            documents.append(row["text"])
    else:
        if not path.is_file():
            raise UserError(f"data file {str(path)!r} does not exist")
        documents = path.read_text(encoding="utf-8").splitlines()
    documents = [document for document in documents if document.strip()]
    if not documents:
        raise UserError(f"data file {str(path)!r} has no text")
    return documents


def choice_item_from_row(row: dict, where: str) -> ChoiceItem:
    """Validate one ``{context, choices, label}`` row; ``where`` names it in the error."""
    context, choices, label = row.get("context"), row.get("choices"), row.get("label")
    if not isinstance(context, str):
        raise UserError(f"{where}: expected a string field 'context'")
    if (
        not isinstance(choices, list)
        or len(choices) < 2
        or not all(isinstance(choice, str) and choice.strip() for choice in choices)
    ):
        raise UserError(f"{where}: 'choices' must be a list of at least two non-empty strings")
    if not isinstance(label, int) or isinstance(label, bool) or not 0 <= label < len(choices):
        raise UserError(
            f"{where}: 'label' must be an integer index into the {len(choices)} choices, got {label!r}"
        )
    scoring = row.get("scoring", ANSWER_SCORING)
    if scoring not in SCORINGS:
        raise UserError(f"{where}: 'scoring' must be one of {', '.join(SCORINGS)}, got {scoring!r}")
    return ChoiceItem(context, tuple(choices), label, scoring)


def read_choice_file(path: str | Path) -> list[ChoiceItem]:
    """Items of a local multiple-choice JSONL file, every row validated."""
    path = Path(path).expanduser()
    items = [choice_item_from_row(row, f"{path}:{number}") for number, row in read_jsonl(path)]
    if not items:
        raise UserError(f"data file {str(path)!r} has no items")
    return items


def _text_file(spec: DataSpec, split: str) -> list[str]:
    return read_text_file(spec.path)


def _choice_file(spec: DataSpec, split: str) -> list[ChoiceItem]:
    return read_choice_file(spec.path)


TEXT_FILE = Source(
    "text",
    TEXT,
    "a local .txt (one document per line) or .jsonl (one per record, field 'text')",
    _text_file,
    needs_path=True,
    path_prefix=True,
    heal_split=True,
)
CHOICE_FILE = Source(
    "mc",
    MULTIPLE_CHOICE,
    "a local .jsonl of {context, choices, label}",
    _choice_file,
    needs_path=True,
    path_prefix=True,
    heal_split=True,
)
