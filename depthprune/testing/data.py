"""Calibration and evaluation data for tests, in the tiny tokenizer's vocabulary, and demo-like model folders.

The tiny models (:mod:`depthprune.testing.models`) have a word-level tokenizer whose words are ``w4`` ...
``w255``, one token each, so random texts and questions made of those words have known token counts::

    rng = random.Random(0)
    write_jsonl(root / "text.jsonl", random_texts(rng, rows=8, words=50))
    write_jsonl(root / "qa.jsonl", random_questions(rng, rows=10, choices=(2, 3, 4), context_words=(3, 10)))
    demo_like_model(tiny_model_dir, root / "model", {"text_test": random_texts(rng, rows=6, words=40)})

A length given as an int is that length; given as ``(low, high)`` it is drawn with ``rng.randrange``.
"""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

from ground.demo.paths import data_file

__all__ = ["demo_like_model", "random_questions", "random_texts", "random_words", "read_jsonl", "write_jsonl"]

Length = int | tuple[int, int]


def random_words(rng: random.Random, count: int) -> str:
    """``count`` random words of the tiny tokenizer's vocabulary, separated by spaces."""
    return " ".join(f"w{rng.randrange(4, 256)}" for _ in range(count))


def random_texts(rng: random.Random, rows: int, words: int) -> list[dict]:
    """``rows`` rows ``{"text"}`` of ``words`` random words each (a ``text:`` data file)."""
    return [{"text": random_words(rng, words)} for _ in range(rows)]


def random_questions(
    rng: random.Random,
    rows: int,
    *,
    choices: int | tuple[int, ...] = 3,
    context_words: Length = 5,
    choice_words: Length = 1,
    labels: Literal["random", "cycle"] = "random",
) -> list[dict]:
    """``rows`` multiple-choice rows ``{"context", "choices", "label"}`` (an ``mc:`` data file).

    Args:
        rng: the random source; rows are drawn one after another, each in the order count, context, choices,
            label.
        rows: how many.
        choices: number of choices per row, or the numbers to pick each row's from.
        context_words: length of the context.
        choice_words: length of each choice.
        labels: ``random`` draws each label; ``cycle`` makes row i's label ``i % its number of choices``.

    Returns:
        The rows.
    """
    questions = []
    for number in range(rows):
        count = choices if isinstance(choices, int) else rng.choice(choices)
        context = random_words(rng, _length(rng, context_words))
        options = [random_words(rng, _length(rng, choice_words)) for _ in range(count)]
        label = rng.randrange(count) if labels == "random" else number % count
        questions.append({"context": context, "choices": options, "label": label})
    return questions


def write_jsonl(path: Path, rows: Iterable[dict]) -> Path:
    """Write ``rows`` to ``path``, one JSON object per line; returns ``path``."""
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def read_jsonl(path: Path) -> list[dict]:
    """The rows of a JSON-lines file; a line that is not JSON (a blank one too) raises ``ValueError``."""
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def demo_like_model(model_dir: Path | str, directory: Path, data: dict[str, list[dict]]) -> Path:
    """A copy of ``model_dir`` at ``directory`` carrying demo-style data files, as the demo model does.

    Args:
        model_dir: a saved model (e.g. a tiny one).
        directory: where to copy it; must not exist.
        data: rows per demo data file name (``text_test``, ``qa_calibration``, ...; see
            :data:`ground.demo.paths.DATA_FILES`).

    Returns:
        ``directory``, which the ``demo:`` data specs and the demo evaluation suites accept.
    """
    shutil.copytree(model_dir, directory)
    for name, rows in data.items():
        path = data_file(directory, name)
        path.parent.mkdir(exist_ok=True)
        write_jsonl(path, rows)
    return directory


def _length(rng: random.Random, length: Length) -> int:
    return length if isinstance(length, int) else rng.randrange(*length)
