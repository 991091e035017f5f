"""``commonsense170k``: Commonsense-170k rows as the task margin scores them: the question, the option
*texts*, the correct one.

The LLM-Adapters ``ft-training_set/commonsense_170k.json`` mixture (BoolQ, PIQA, SIQA, HellaSwag, WinoGrande,
ARC, OBQA) the study calibrates the task margin on, from the hub; ``commonsense170k:PATH`` (or
``commonsense170k@PATH``) reads a local copy of the published file. It has only its training file: every
split gives the same rows.

LLM-Adapters' ``ft-training_set/commonsense_170k.json`` is the training sets of eight tasks rewritten as
instructions. Every row names its label set on an ``Answer format:`` line and its answer after ``the correct
answer is``; the option texts sit inside the instruction behind markers (the published format, one per
sub-task)::

    boolq       Please answer the following question with true or false, question: {question}
                \\n\\nAnswer format: true/false
    piqa        Please choose the correct solution to the question: {goal}
                \\n\\nSolution1: {sol1}\\n\\nSolution2: {sol2}\\n\\nAnswer format: solution1/solution2
    siqa, arc,  Please choose the correct answer to the question: {question}
    obqa        \\n\\nAnswer1: {a1} Answer2: {a2} ... AnswerK: {aK}\\n\\nAnswer format: answer1/.../answerK
                (K = 3 for SIQA, 4 for OBQA, 3 to 5 for ARC)
    hellaswag   Please choose the correct ending to complete the given sentence: {activity}: {ctx}
                \\n\\nEnding1: {e1} Ending2: {e2} Ending3: {e3} Ending4: {e4}
                \\n\\nAnswer format: ending1/ending2/ending3/ending4
    winogrande  Please choose the correct answer to fill in the blank to complete the given sentence:
                {sentence with _}\\n\\nOption1: {o1} Option2: {o2} Answer format: option1/option2

A row becomes a :class:`~pruning.calibration.data.items.ChoiceItem` scored the way PuDDing (Wee et al., ICML
2025, ``tada0347/PuDDing``, ``codes/4_layerset/*_likelihood_diff.py``) scores the original tasks:

* the **context** is the question alone — the instruction without its preface (the text up to the first
  colon) and without the option list, as PuDDing's prompt ``"Question: {question}\\nAnswer: {option}"``
  never shows the options. For HellaSwag that is ``"{activity}: {ctx}"``, exactly PuDDing's;
* the **choices** are the option texts; BoolQ has none in the instruction, and PuDDing scores the words
  ``True`` and ``False``, so those are its choices;
* WinoGrande is scored as PuDDing scores it: each option fills the blank ``_`` and the whole sentence's
  mean token log-probability is ℓ (``scoring="sentence"``), not an answer after ``Answer:``.

The label words (``option1``, ``ending3``) are never scored: every choice would share its first token.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from ground.core.errors import UserError
from pruning.calibration.data.hub import hub_rows
from pruning.calibration.data.items import (
    ANSWER_SCORING,
    MULTIPLE_CHOICE,
    SENTENCE_SCORING,
    ChoiceItem,
    DataSpec,
    Source,
)
from pruning.calibration.data.local import read_jsonl

COMMONSENSE_170K_URL = "https://raw.githubusercontent.com/AGI-Edgerunners/LLM-Adapters/main/ft-training_set/commonsense_170k.json"

ANSWER_FORMAT = re.compile(r"Answer format:\s*([^\n]+)", re.IGNORECASE)
CORRECT_ANSWER = re.compile(r"the correct answer is\s*([^\s.,;]+)", re.IGNORECASE)
PREFACE = re.compile(r"^\s*Please [^:]*:\s*")
"""The instruction's preface, up to its first colon ("Please choose the correct answer to the question:")."""

BOOLQ_CHOICES = {"true": "True", "false": "False"}
"""BoolQ's label words and the texts PuDDing scores for them."""

SUBTASKS = {
    "solution": "piqa",
    "answer": "siqa/arc/obqa",
    "ending": "hellaswag",
    "option": "winogrande",
}
"""Label stem (``solution1`` -> ``solution``) -> the sub-tasks that use it."""


def subtask_of(labels: tuple[str, ...]) -> str:
    """The sub-task of a label set: ``boolq``, ``piqa``, ``siqa/arc/obqa``, ``hellaswag`` or ``winogrande``.

    Raises:
        UserError: a label set none of the eight tasks uses.
    """
    lowered = tuple(label.lower() for label in labels)
    if set(lowered) == set(BOOLQ_CHOICES):
        return "boolq"
    stems = {re.sub(r"\d+$", "", label) for label in lowered}
    numbered = all(re.fullmatch(r"[a-z]+\d+", label) for label in lowered)
    if numbered and len(stems) == 1 and (stem := stems.pop()) in SUBTASKS:
        return SUBTASKS[stem]
    raise UserError(f"label set {'/'.join(labels)!r} is not one of Commonsense-170k's sub-tasks")


def option_texts(instruction: str, labels: tuple[str, ...], where: str) -> tuple[int, list[str]]:
    """Where the option list starts in ``instruction``, and the text behind each label's marker.

    A label ``option1`` is marked ``Option1:`` (any case); an option's text runs to the next marker, the last
    one's to ``Answer format:``.

    Raises:
        UserError: a marker is missing or out of order, or an option's text is empty.
    """
    answer_format = ANSWER_FORMAT.search(instruction)
    end_of_options = answer_format.start() if answer_format else len(instruction)
    spans, cursor = [], 0
    for label in labels:
        marker = re.compile(rf"{re.escape(label)}\s*:", re.IGNORECASE).search(instruction, cursor)
        if marker is None or marker.start() >= end_of_options:
            raise UserError(f"{where}: no '{label.capitalize()}:' option in the instruction")
        spans.append((marker.start(), marker.end()))
        cursor = marker.end()
    texts = []
    for number, (label, (_, text_start)) in enumerate(zip(labels, spans, strict=True)):
        text_end = spans[number + 1][0] if number + 1 < len(spans) else end_of_options
        text = instruction[text_start:text_end].strip()
        if not text:
            raise UserError(f"{where}: option '{label.capitalize()}:' has no text")
        texts.append(text)
    return spans[0][0], texts


def question_of(instruction: str, end: int, extra_input: object) -> str:
    """The question: the instruction before ``end`` without its preface, plus a non-empty ``input``."""
    question = PREFACE.sub("", instruction[:end], count=1).strip()
    if isinstance(extra_input, str) and extra_input.strip():
        question = f"{question}\n{extra_input.strip()}"
    return question


def correct_label(row: dict, labels: tuple[str, ...], where: str) -> int:
    """Index of the label named after ``the correct answer is`` (in ``output``, else the ``answer`` field).

    Raises:
        UserError: no answer, or one outside the label set.
    """
    output = row.get("output") if isinstance(row.get("output"), str) else ""
    found = CORRECT_ANSWER.search(output)
    chosen = found.group(1) if found else row.get("answer")
    if not isinstance(chosen, str):
        raise UserError(f"{where}: no 'the correct answer is ...' in the output and no 'answer' field")
    lowered = [label.lower() for label in labels]
    if chosen.strip().lower() not in lowered:
        raise UserError(f"{where}: answer {chosen!r} is not one of the labels {list(labels)}")
    return lowered.index(chosen.strip().lower())


def parse_commonsense_row(row: dict, where: str = "commonsense170k") -> ChoiceItem:
    """Turn one LLM-Adapters Commonsense-170k row into the item PuDDing's margin scores.

    Args:
        row: ``{"instruction", "input", "output", "answer"}`` as published (see the module docstring).
        where: names the row in error messages.

    Returns:
        The item: the question as context, the option texts as choices, the correct option's index, and
        ``scoring="sentence"`` for WinoGrande (its blank filled by each option).

    Raises:
        UserError: no label set, an unknown one, a missing option, or an answer outside the label set.
    """
    instruction = row.get("instruction")
    if not isinstance(instruction, str):
        raise UserError(f"{where}: expected a string field 'instruction'")
    found = ANSWER_FORMAT.search(instruction)
    if not found:
        raise UserError(f"{where}: no 'Answer format: ...' label set in the instruction")
    labels = tuple(label.strip() for label in found.group(1).split("/") if label.strip())
    if len(labels) < 2:
        raise UserError(f"{where}: the answer format {found.group(1)!r} lists fewer than two labels")
    label = correct_label(row, labels, where)
    subtask = subtask_of(labels)
    if subtask == "boolq":
        question = question_of(instruction, found.start(), row.get("input"))
        return ChoiceItem(question, tuple(BOOLQ_CHOICES[word.lower()] for word in labels), label)
    options_start, texts = option_texts(instruction, labels, where)
    question = question_of(instruction, options_start, row.get("input"))
    scoring = SENTENCE_SCORING if subtask == "winogrande" and "_" in question else ANSWER_SCORING
    return ChoiceItem(question, tuple(texts), label, scoring)


def read_commonsense_file(path: str | Path) -> list[dict]:
    """The rows of a local ``commonsense_170k.json`` (a JSON list of objects; JSONL is read too)."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise UserError(f"Commonsense-170k file {str(path)!r} does not exist")
    text = path.read_text(encoding="utf-8")
    try:
        rows = json.loads(text)
    except json.JSONDecodeError:
        rows = [row for _, row in read_jsonl(path)]
    if not isinstance(rows, list) or not all(isinstance(row, dict) for row in rows):
        raise UserError(f"{str(path)!r} is not a Commonsense-170k file (a JSON list of objects)")
    return rows


def _commonsense_items(spec: DataSpec, split: str) -> list[ChoiceItem]:
    if spec.path:
        rows = read_commonsense_file(spec.path)
        where = str(Path(spec.path).expanduser())
    else:
        rows = hub_rows(
            spec,
            COMMONSENSE_170K.description,
            "demo:qa, mc:PATH or commonsense170k:/path/to/commonsense_170k.json; "
            "or pydoc-cloze (cloze items from Python's documentation)",
            "json",
            data_files=COMMONSENSE_170K_URL,
            split="train",
        )
        where = "commonsense_170k.json"
    items = [parse_commonsense_row(dict(row), f"{where} row {index}") for index, row in enumerate(rows)]
    if not items:
        raise UserError(f"{where} has no rows")
    return items


COMMONSENSE_170K = Source(
    "commonsense170k",
    MULTIPLE_CHOICE,
    "LLM-Adapters Commonsense-170k (commonsense_170k.json)",
    _commonsense_items,
    path_prefix=True,
    at_path=True,
)
