"""The user's own data as evaluation suites: ``--suite text:PATH`` and ``--suite mc:PATH``.

The files are those ``prune --data`` takes (:mod:`pruning.calibration.data.local`):

* ``text:PATH`` — a ``.txt`` (one document per non-blank line) or ``.jsonl`` (one per record, field
  ``text``), scored with the perplexity protocol of :mod:`pruning.evaluation.suites` (documents joined
  with EOS, cut into non-overlapping ``seq_len`` windows, ``exp(Σ NLL / Σ tokens)``), with a bootstrap
  interval over windows;
* ``mc:PATH`` — a JSONL of ``{"context", "choices", "label"}`` (optionally ``"scoring"``), scored as lm-eval
  scores a ``multiple_choice`` task, with the same tokenization (:class:`PairEncoder`): ``answer`` items
  (the default) as the demo task, prompt ``"Question: {context}\\nAnswer:"``, each choice its continuation
  after a space; ``acc`` picks the choice with the highest summed log-probability, ``acc_norm`` the highest
  per character of the choice. ``sentence`` items as lm-eval's WinoGrande: the choice fills the blank ``_``
  and the rest of the sentence, the same for every choice, is scored after each filled prefix (``acc_norm``
  equals ``acc`` there: every choice scores the same tokens). Every item is kept with its correctness.

Every file is read and every item checked before any model loads; a missing field, a label out of range,
an empty choice, a JSONL record with empty text, a ``sentence`` item without a blank, or an item longer than
the model's context is a one-line error naming the file and line. Nothing is dropped silently (blank lines
of a ``.txt`` are not documents). A suite's results have suite ``user`` and the file's name without its
extension as task (the whole spec where two files share a name).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from ground.core.errors import UserError
from pruning.calibration.data.local import MAX_BYTES_PER_TOKEN, check_data_file

USER_SUITE = "user"
"""The ``suite`` of every result of a user's file."""
PREFIXES = ("text:", "mc:")
ANSWER_PROMPT = "Question: {context}\nAnswer:"
"""The prompt of ``answer`` items (the demo task's and the task objectives')."""


def is_user_suite(suite: str) -> bool:
    """Whether a ``--suite`` entry names a user's file (``text:PATH`` or ``mc:PATH``)."""
    return suite.startswith(PREFIXES)


@dataclass
class UserTask:
    """One user file, read and checked."""

    spec: str
    """The ``--suite`` entry as given (``mc:questions.jsonl``)."""
    kind: str
    """``text`` or ``mc``."""
    path: Path
    """The file."""
    task: str = ""
    """The results' task name (see :func:`name_tasks`)."""
    documents: list[str] = field(default_factory=list)
    """Text: the documents in file order."""
    items: list = field(default_factory=list)
    """Multiple choice: the :class:`~pruning.calibration.data.items.ChoiceItem` list in file order."""
    lines: list[int] = field(default_factory=list)
    """Multiple choice: each item's line in the file (for errors)."""
    sha256: str = ""
    """sha256 of the file's bytes (stored with each result)."""


def read_user_task(spec: str) -> UserTask:
    """Read and check one ``text:PATH`` / ``mc:PATH`` file (everything but the context length)."""
    from pruning.calibration.data.specs import parse_spec

    parsed = parse_spec(spec)
    kind = "text" if parsed.source == "text" else "mc"
    path = Path(parsed.path).expanduser()
    check_data_file(path, f"data file of --suite {spec!r},")
    with path.open("rb") as handle:  # in blocks: the file is never held whole
        sha256 = hashlib.file_digest(handle, "sha256").hexdigest()
    task = UserTask(spec, kind, path, sha256=sha256)
    if kind == "text":
        task.documents = _read_documents(path)
    else:
        task.lines, task.items = _read_items(path)
    return task


def _read_documents(path: Path) -> list[str]:
    from pruning.calibration.data.local import read_jsonl, read_text_file

    if path.suffix != ".jsonl":
        return read_text_file(path)
    documents = []
    for number, row in read_jsonl(path):
        if not isinstance(row.get("text"), str) or not row["text"].strip():
            raise UserError(f"{path}:{number}: expected a non-empty string field 'text'")
        documents.append(row["text"])
    if not documents:
        raise UserError(f"data file {str(path)!r} has no text")
    return documents


def _read_items(path: Path) -> tuple[list[int], list]:
    from pruning.calibration.data.items import SENTENCE_SCORING
    from pruning.calibration.data.local import choice_item_from_row, read_jsonl

    lines, items = [], []
    for number, row in read_jsonl(path):
        item = choice_item_from_row(row, f"{path}:{number}")
        if item.scoring == SENTENCE_SCORING and not item.context.partition("_")[2].strip():
            raise UserError(
                f"{path}:{number}: a 'sentence' item needs a blank '_' in 'context' with text after it"
            )
        lines.append(number)
        items.append(item)
    if not items:
        raise UserError(f"data file {str(path)!r} has no items")
    return lines, items


def name_tasks(tasks: list[UserTask]) -> None:
    """Each task's name: its file's name without extension, or its whole spec where two names collide."""
    stems = [task.path.stem for task in tasks]
    for task, stem in zip(tasks, stems, strict=True):
        task.task = stem if stems.count(stem) == 1 else task.spec


def choice_requests(item, encoder) -> list:
    """The :class:`ScoreRequest` of each choice of an item (see the module docstring)."""
    from pruning.calibration.data.items import SENTENCE_SCORING

    if item.scoring == SENTENCE_SCORING:
        before, _, after = item.context.partition("_")
        return [encoder.encode_pair(before + choice, " " + after.strip()) for choice in item.choices]
    prompt = ANSWER_PROMPT.format(context=item.context)
    return [encoder.encode_pair(prompt, " " + choice) for choice in item.choices]


def check_fits(tasks: list[UserTask], tokenizer, context: int, seq_len: int) -> None:
    """Every item within the model's context, every text at least one window long; else a one-line error.

    Call :func:`check_item_bytes` first, before the tokenizer loads; a text is tokenised here only as far
    as one window needs (:func:`~pruning.calibration.data.sampling.tokenize_stream_prefix`).

    Args:
        tasks: the user's files.
        tokenizer: the model's tokenizer.
        context: the longest sequence the engine scores.
        seq_len: perplexity window length (already capped at ``context``).
    """
    from pruning.calibration.data.sampling import tokenize_stream_prefix
    from pruning.evaluation.lm_eval_models import PairEncoder

    encoder = PairEncoder(tokenizer)
    for task in tasks:
        if task.kind == "text":
            tokens = len(tokenize_stream_prefix(task.documents, tokenizer, seq_len))
            if tokens < seq_len:
                raise UserError(
                    f"{task.path}: {tokens} tokens, shorter than one perplexity window of {seq_len}: "
                    "add text or lower --seq-len"
                )
            continue
        for line, item in zip(task.lines, task.items, strict=True):
            longest = max(len(r.context) + len(r.continuation) for r in choice_requests(item, encoder))
            if longest > context:
                raise UserError(
                    f"{task.path}:{line}: the item is {longest} tokens, longer than the model's context of "
                    f"{context}"
                )


def check_item_bytes(tasks: list[UserTask], context: int) -> None:
    """Refuse, by its length in bytes and before any tokenizer runs, a multiple-choice item that cannot fit
    ``context`` tokens: its context and longest choice over ``context x MAX_BYTES_PER_TOKEN`` bytes."""
    limit = context * MAX_BYTES_PER_TOKEN
    for task in tasks:
        for line, item in zip(task.lines, task.items, strict=True):
            size = utf8_length(item.context) + max(utf8_length(choice) for choice in item.choices)
            if size > limit:
                raise UserError(
                    f"{task.path}:{line}: the item is {size:,} bytes, more than the {limit:,} that the "
                    f"model's context of {context} tokens can hold ({MAX_BYTES_PER_TOKEN} bytes per token at "
                    "most)"
                )


def utf8_length(text: str) -> int:
    """Bytes of ``text`` in UTF-8 (surrogates, which JSON escapes can make, counted as 3 bytes)."""
    return len(text.encode("utf-8", "surrogatepass"))


def context_length(model_path: str, engine: str) -> int:
    """The longest sequence the chosen engine will score for a model, read from its config (no weights)."""
    from ground.planning.shape import read_model_config
    from pruning.runtime.engine_choice import resolve_engine

    config = read_model_config(model_path)  # config.json alone: no transformers import before the checks
    native = int(
        config.get("max_position_embeddings")
        or (config.get("text_config") or {}).get("max_position_embeddings")
        or 2048
    )
    return native if resolve_engine(engine) == "torch" else min(native, 4096) - 1


def score_choice_task(engine, task: UserTask, progress: bool = False) -> dict[str, list[int]]:
    """``{"acc": [0/1 per item], "acc_norm": [...]}`` of a multiple-choice file (module docstring)."""
    from pruning.calibration.data.items import SENTENCE_SCORING
    from pruning.evaluation.lm_eval_models import PairEncoder

    encoder = PairEncoder(engine.tokenizer)
    requests, owners = [], []
    for number, item in enumerate(task.items):
        for request in choice_requests(item, encoder):
            requests.append(request)
            owners.append(number)
    scores: list[list[float]] = [[] for _ in task.items]
    for owner, result in zip(owners, engine.score(requests, progress=progress), strict=True):
        scores[owner].append(result.logprob)
    correct: dict[str, list[int]] = {"acc": [], "acc_norm": []}
    for item, lls in zip(task.items, scores, strict=True):
        best = max(range(len(lls)), key=lls.__getitem__)
        correct["acc"].append(int(best == item.label))
        if item.scoring != SENTENCE_SCORING:
            per_char = [ll / len(choice) for ll, choice in zip(lls, item.choices, strict=True)]
            best = max(range(len(per_char)), key=per_char.__getitem__)
        correct["acc_norm"].append(int(best == item.label))
    return correct


def item_keys(task: UserTask) -> list[str]:
    """The identity key of each multiple-choice item (its context, choices, label and scoring)."""
    from dataclasses import asdict

    from pruning.evaluation.item_scores import content_key

    return [content_key(asdict(item)) for item in task.items]
