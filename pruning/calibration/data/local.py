"""Local files: ``text:PATH`` (``.txt``, one document per non-blank line, or ``.jsonl``, one per record's
``text`` field) and ``mc:PATH`` (a JSONL of ``{"context", "choices", "label"}``, optionally ``"scoring"``).

Both give the whole file for every split, ``heal`` included. Files are read as a stream, line by line, and
must be UTF-8 (a byte-order mark is allowed): a byte that is not, a line that is not a JSON object, or a path
that is a directory is a one-line error naming the file (and line), never a traceback. What a line may hold
once a model is known (:data:`MAX_BYTES_PER_TOKEN`) is checked where the model is known, before tokenising.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

from ground.core.errors import UserError
from pruning.calibration.data.items import (
    ANSWER_SCORING,
    MULTIPLE_CHOICE,
    SCORINGS,
    TEXT,
    ChoiceItem,
    DataSpec,
    Source,
)

MAX_BYTES_PER_TOKEN = 64
"""The most UTF-8 bytes one token is taken to stand for. An item that must fit a model's context of ``C``
tokens has at most ``C x 64`` bytes, so a longer one is refused by its length before any tokenizer runs
(tokenising a 50 MB line took minutes and gigabytes only to say it was too long). 64 is well above what a
token of common vocabularies covers: about 4 bytes of English on average, at most a few dozen (runs of
spaces in code vocabularies, a CJK word written as JSON ``\\uXXXX`` escapes)."""


SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
"""A JSON escape of a UTF-16 surrogate: the only way a line of valid UTF-8 can give one."""


def check_data_file(path: Path, what: str = "data file") -> None:
    """A one-line error unless ``path`` is a file (missing, or a directory, each said so)."""
    if path.is_dir():
        raise UserError(f"{what} {str(path)!r} is a directory; give a file")
    if not path.is_file():
        raise UserError(f"{what} {str(path)!r} does not exist")


def read_lines(path: Path) -> Iterator[tuple[int, str]]:
    """``(line number, text)`` of a UTF-8 file, one line at a time (line endings removed).

    Raises:
        UserError: the path is not a file, or a line is not UTF-8 (naming the line, column and byte).
    """
    check_data_file(path)
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise UserError(
                    f"{path}:{number}: not UTF-8 text (byte 0x{raw[error.start]:02x} at column "
                    f"{error.start + 1}); save the file as UTF-8"
                ) from None
            yield number, line.rstrip("\r\n")


def read_jsonl(path: Path) -> list[tuple[int, dict]]:
    """``(line number, object)`` of every non-blank line of a JSONL file.

    Raises:
        UserError: a line that is not UTF-8, not JSON, or not a JSON object, naming the file and line.
    """
    rows = []
    for number, line in read_lines(path):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (ValueError, RecursionError) as error:  # ValueError: JSONDecodeError, a 5,000-digit number
            if isinstance(error, RecursionError):
                reason = "nested too deeply"
            else:
                reason = error.msg if isinstance(error, json.JSONDecodeError) else str(error)[:80]
            raise UserError(f"{path}:{number}: not valid JSON ({reason})") from None
        if not isinstance(row, dict):
            raise UserError(f"{path}:{number}: expected a JSON object per line")
        try:  # a \ud800 escape decodes to a lone surrogate, which no tokenizer takes
            if SURROGATE_ESCAPE.search(line):  # paired ones (an emoji) are text: encode to see
                json.dumps(row, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise UserError(
                f"{path}:{number}: holds a lone surrogate escape (such as \\ud800), not text"
            ) from None
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
        # splitlines: the documents str.splitlines made of the whole file (its other line breaks too)
        documents = [document for _, line in read_lines(path) for document in line.splitlines()]
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
