"""Calibration and evaluation data: one spec string per source, resolved to text windows or questions.

Specs (``DATA_SOURCES`` lists them with their kind):

* ``c4``, ``wikitext2``, ``lambada`` — flowing text from the Hugging Face hub through ``datasets``, as the
  pruning literature uses them: C4 ``allenai/c4`` English shards (calibration from the first train shard,
  evaluation from ``en/c4-validation.00000-of-00008.json.gz`` like SparseGPT/SLEB), WikiText-2
  ``wikitext-2-raw-v1`` (train / test), LAMBADA (``cimec/lambada`` validation for calibration,
  ``EleutherAI/lambada_openai`` test for evaluation, the split lm-eval scores).
* ``commonsense170k`` — the LLM-Adapters ``ft-training_set/commonsense_170k.json`` mixture (BoolQ, PIQA,
  SIQA, HellaSwag, WinoGrande, ARC, OBQA) the study calibrates the task margin on. Each row becomes the item
  PuDDing scores: the question, the option *texts* parsed from the instruction, the correct one's index
  (:mod:`pruning.calibration.commonsense`). ``commonsense170k:PATH`` (or ``commonsense170k@PATH``) reads a
  local copy of the published file.
* ``demo:text`` / ``demo:qa`` — the held-out splits of the demo model (``data/text_*.jsonl`` and
  ``data/qa_*.jsonl``); ``demo:text@DIR`` names the demo model directory explicitly.
* ``pydoc`` / ``pydoc-cloze`` — real English that installs with Python, offline: the documentation topics
  every CPython ships (``pydoc_data.topics``) as text documents, and LAMBADA-style cloze items built from
  them (passage, its true final word, three distractors from the same split). They alone have a ``heal``
  split besides ``calibration`` and ``test``; topics are split by a stable hash of their name, so the splits
  never overlap. Provenance, deduplication and counts: :mod:`pruning.calibration.offline_sources`.
* ``text:PATH`` — a local ``.txt`` file (one document per non-blank line) or ``.jsonl`` (one document per
  record, its ``text`` field).
* ``mc:PATH`` — a local JSONL of ``{"context": ..., "choices": [...], "label": i}`` (optionally
  ``"scoring": "sentence"``, see :class:`ChoiceItem`).

Text samples (``sampling``, :data:`SAMPLINGS`):

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

Documents: a hub row is one document, but WikiText-2's rows are lines, so its calibration split is cut into
articles (a new one at each ``" = Title = "`` heading) and its test split is every line joined with
``"\n\n"``, one document, as SLEB and SparseGPT evaluate it.

Splits: ``calibration`` and ``test`` for every source (a local file gives the whole file for either),
``heal`` for ``HEAL_SOURCES`` only.

Offline (no network, as on the machines this repository is tested on), a hub source that cannot be fetched
raises a :class:`UserError` naming the local spec to use instead.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from pathlib import Path

from depthprune.demo.paths import data_file, default_demo_dir
from depthprune.errors import UserError

TEXT = "text"
MULTIPLE_CHOICE = "multiple_choice"

# spec name -> (kind, description); ``text:``/``mc:`` take a path, ``demo:*`` an optional ``@DIR``.
DATA_SOURCES: dict[str, tuple[str, str]] = {
    "c4": (TEXT, "C4 English (allenai/c4 shards)"),
    "wikitext2": (TEXT, "WikiText-2 raw (wikitext-2-raw-v1)"),
    "lambada": (TEXT, "LAMBADA passages"),
    "commonsense170k": (MULTIPLE_CHOICE, "LLM-Adapters Commonsense-170k (commonsense_170k.json)"),
    "pydoc": (TEXT, "Python's documentation topics (pydoc_data, ships with CPython; offline)"),
    "pydoc-cloze": (MULTIPLE_CHOICE, "cloze items from Python's documentation topics (offline)"),
    "demo:text": (TEXT, "the demo model's held-out text (data/text_*.jsonl)"),
    "demo:qa": (MULTIPLE_CHOICE, "the demo model's held-out questions (data/qa_*.jsonl)"),
    "text:PATH": (TEXT, "a local .txt (one document per line) or .jsonl (one per record, field 'text')"),
    "mc:PATH": (MULTIPLE_CHOICE, "a local .jsonl of {context, choices, label}"),
    "commonsense170k:PATH": (MULTIPLE_CHOICE, "a local copy of commonsense_170k.json"),
}
SPLITS = ("calibration", "heal", "test")
SAMPLINGS = ("documents", "stream")
"""How text instances are cut: one document each (default), or windows of the joined stream."""
ANSWER_SCORING = "answer"
SENTENCE_SCORING = "sentence"
SCORINGS = (ANSWER_SCORING, SENTENCE_SCORING)
"""How a multiple-choice item's choices are scored (see :class:`ChoiceItem`)."""
HEAL_SOURCES = ("pydoc", "pydoc-cloze", "text", "mc")
"""Sources with a ``heal`` split (training text for healing); the local files give the whole file."""

C4_FILES = {
    "calibration": ("train", "en/c4-train.00000-of-01024.json.gz"),
    "test": ("validation", "en/c4-validation.00000-of-00008.json.gz"),
}
COMMONSENSE_170K_URL = "https://raw.githubusercontent.com/AGI-Edgerunners/LLM-Adapters/main/ft-training_set/commonsense_170k.json"


@dataclass(frozen=True)
class DataSpec:
    """A parsed data spec string."""

    spec: str
    """The string as given, e.g. ``"demo:qa@/models/demo"``."""
    source: str
    """The source name: a key of :data:`DATA_SOURCES`, or ``"text"`` / ``"mc"`` for the path specs
    (``commonsense170k:PATH`` is source ``commonsense170k`` with a path)."""
    kind: str
    """``"text"`` or ``"multiple_choice"``."""
    path: str | None = None
    """The local file (``text:``, ``mc:``, ``commonsense170k:``) or demo directory (``demo:*@``), if any."""


@dataclass(frozen=True)
class ChoiceItem:
    """One multiple-choice question."""

    context: str
    """The question (goes after ``Question:`` in the prompt), or a sentence with a ``_`` blank."""
    choices: tuple[str, ...]
    """The candidate answers (at least two)."""
    label: int
    """Index of the correct choice."""
    scoring: str = ANSWER_SCORING
    """``answer``: ℓ is the mean log-probability of the choice's tokens after the prompt
    ``"Question: {context}\\nAnswer:"`` (PuDDing's); ``sentence``: the choice fills the blank ``_`` of
    ``context`` and ℓ is the mean log-probability of every token of the filled sentence after its first
    (PuDDing's WinoGrande)."""

    def __post_init__(self):
        if self.scoring not in SCORINGS:
            raise UserError(f"unknown scoring {self.scoring!r}; use one of {', '.join(SCORINGS)}")


@dataclass
class TextSamples:
    """Calibration text: ``samples`` token sequences of equal length."""

    input_ids: list[list[int]]
    """``samples`` sequences of ``seq_len`` token ids each."""
    source: str
    """The spec they came from."""
    sampling: str = "documents"
    """How they were cut (:data:`SAMPLINGS`)."""
    skipped: int = 0
    """``documents`` sampling: documents visited and skipped for being shorter than ``seq_len`` tokens."""
    documents: list[int] | None = None
    """``documents`` sampling: index of each instance's document in the source's split."""

    kind = TEXT


@dataclass
class ChoiceSamples:
    """Calibration questions."""

    items: list[ChoiceItem]
    """The drawn items."""
    source: str
    """The spec they came from."""

    kind = MULTIPLE_CHOICE


def known_specs() -> str:
    """The spec forms, for error messages."""
    return ", ".join(DATA_SOURCES)


def parse_spec(spec: str) -> DataSpec:
    """Parse a data spec string without reading anything.

    Raises:
        UserError: the spec names no known source, or a path spec has no path.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise UserError(f"empty data spec; use one of: {known_specs()}")
    spec = spec.strip()
    for prefix, source in (("text:", "text"), ("mc:", "mc"), ("commonsense170k:", "commonsense170k")):
        if spec.startswith(prefix):
            path = spec[len(prefix) :]
            if not path:
                raise UserError(f"data spec {spec!r} needs a file path, e.g. {prefix}calibration.jsonl")
            return DataSpec(spec, source, DATA_SOURCES[f"{prefix}PATH"][0], path)
    name, _, path = spec.partition("@")
    if name not in DATA_SOURCES or name.endswith("PATH"):
        raise UserError(f"unknown data spec {spec!r}; use one of: {known_specs()}")
    if "@" in spec and not path:
        raise UserError(f"data spec {spec!r} has an empty path after '@'")
    if path and name not in ("demo:text", "demo:qa", "commonsense170k"):
        raise UserError(f"data spec {name!r} takes no '@PATH'")
    return DataSpec(spec, name, DATA_SOURCES[name][0], path or None)


def spec_kind(spec: str) -> str:
    """``"text"`` or ``"multiple_choice"`` for a spec string (no data is read)."""
    return parse_spec(spec).kind


# --------------------------------------------------------------------------------------------- local files


def _read_jsonl(path: Path) -> list[tuple[int, dict]]:
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
        for number, row in _read_jsonl(path):
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
    items = [choice_item_from_row(row, f"{path}:{number}") for number, row in _read_jsonl(path)]
    if not items:
        raise UserError(f"data file {str(path)!r} has no items")
    return items


# ----------------------------------------------------------------------------------------------- the hub


def _offline_error(spec: DataSpec, error: Exception, alternative: str) -> UserError:
    first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
    return UserError(
        f"cannot load {spec.source!r} ({DATA_SOURCES[spec.source][1]}): {first_line[:200]}. "
        f"Offline? Use a local spec instead: {alternative}"
    )


def _hub_rows(spec: DataSpec, alternative: str, *args, **kwargs):
    """``datasets.load_dataset(*args, **kwargs)``; any failure becomes a one-line UserError."""
    try:
        from datasets import load_dataset

        return load_dataset(*args, **kwargs)
    except Exception as error:  # noqa: BLE001 - network, auth and format errors all mean "not available here"
        raise _offline_error(spec, error, alternative) from None


def _hub_text(spec: DataSpec, split: str) -> list[str]:
    local = "demo:text or text:PATH; or pydoc (Python's documentation, ships with Python)"
    if spec.source == "c4":
        hub_split, data_file = C4_FILES[split]
        rows = _hub_rows(spec, local, "allenai/c4", data_files={hub_split: data_file}, split=hub_split)
        return [row["text"] for row in rows]
    if spec.source == "wikitext2":
        rows = _hub_rows(
            spec, local, "wikitext", "wikitext-2-raw-v1", split="train" if split == "calibration" else "test"
        )
        lines = [row["text"] for row in rows]
        # SLEB/SparseGPT evaluate on every line joined with blank lines; calibration draws whole articles.
        return ["\n\n".join(lines)] if split == "test" else wikitext_articles(lines)
    if spec.source == "lambada":
        if split == "calibration":
            rows = _hub_rows(spec, local, "cimec/lambada", split="validation")
        else:
            rows = _hub_rows(spec, local, "EleutherAI/lambada_openai", "default", split="test")
        return [row["text"] for row in rows]
    raise AssertionError(spec.source)


def wikitext_articles(lines: list[str]) -> list[str]:
    """WikiText rows (lines) grouped into articles: a new one starts at each top-level ``" = Title = "``."""
    articles: list[list[str]] = []
    for line in lines:
        if _WIKITEXT_TITLE.match(line) or not articles:
            articles.append([])
        articles[-1].append(line)
    return ["".join(article) for article in articles if "".join(article).strip()]


_WIKITEXT_TITLE = re.compile(r"^ = [^=].* = \n?$")


def read_commonsense_file(path: str | Path) -> list[dict]:
    """The rows of a local ``commonsense_170k.json`` (a JSON list of objects; JSONL is read too)."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise UserError(f"Commonsense-170k file {str(path)!r} does not exist")
    text = path.read_text(encoding="utf-8")
    try:
        rows = json.loads(text)
    except json.JSONDecodeError:
        rows = [row for _, row in _read_jsonl(path)]
    if not isinstance(rows, list) or not all(isinstance(row, dict) for row in rows):
        raise UserError(f"{str(path)!r} is not a Commonsense-170k file (a JSON list of objects)")
    return rows


def _hub_commonsense(spec: DataSpec) -> list[ChoiceItem]:
    from pruning.calibration.commonsense import parse_commonsense_row

    if spec.path:
        rows = read_commonsense_file(spec.path)
        where = str(Path(spec.path).expanduser())
    else:
        rows = _hub_rows(
            spec,
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


# -------------------------------------------------------------------------------------------------- demo


def demo_dir(spec: DataSpec) -> Path:
    """The demo model directory a ``demo:*`` spec points at (the default recipe's when no ``@DIR``)."""
    if spec.path:
        return Path(spec.path).expanduser()
    return default_demo_dir()


def _demo_file(spec: DataSpec, split: str) -> Path:
    stem = "text" if spec.source == "demo:text" else "qa"
    path = data_file(demo_dir(spec), f"{stem}_{split}")
    if not path.is_file():
        raise UserError(
            f"{str(path)!r} does not exist: build the demo model first (`depthprune demo-model`) "
            f"or name its directory as {spec.source}@DIR"
        )
    return path


# ------------------------------------------------------------------------------------------------ loading


def _check_split(parsed: DataSpec, split: str) -> None:
    if split not in SPLITS:
        raise UserError(f"unknown split {split!r}; use one of {', '.join(SPLITS)}")
    if split == "heal" and parsed.source not in HEAL_SOURCES:
        raise UserError(
            f"data {parsed.spec!r} has no 'heal' split; "
            f"sources with one: pydoc, pydoc-cloze, text:PATH, mc:PATH"
        )


def load_documents(spec: str, split: str = "calibration") -> list[str]:
    """All documents of a text source's split."""
    parsed = parse_spec(spec)
    _check_split(parsed, split)
    if parsed.kind != TEXT:
        raise UserError(f"data {spec!r} is multiple-choice, not text")
    if parsed.source == "pydoc":
        from pruning.calibration.offline_sources import pydoc_documents

        return [document.text for document in pydoc_documents(split)]
    if parsed.source == "text":
        return read_text_file(parsed.path)
    if parsed.source == "demo:text":
        return read_text_file(_demo_file(parsed, split))
    documents = [document for document in _hub_text(parsed, split) if document.strip()]
    if not documents:
        raise UserError(f"data {spec!r} ({split}) has no text")
    return documents


def load_choice_items(spec: str, split: str = "calibration") -> list[ChoiceItem]:
    """All items of a multiple-choice source's split (Commonsense-170k has only its training file)."""
    parsed = parse_spec(spec)
    _check_split(parsed, split)
    if parsed.kind != MULTIPLE_CHOICE:
        raise UserError(f"data {spec!r} is text, not multiple-choice")
    if parsed.source == "pydoc-cloze":
        from pruning.calibration.offline_sources import cloze_items

        return cloze_items(split)
    if parsed.source == "mc":
        return read_choice_file(parsed.path)
    if parsed.source == "demo:qa":
        return read_choice_file(_demo_file(parsed, split))
    return _hub_commonsense(parsed)


def tokenize_stream(documents: list[str], tokenizer) -> list[int]:
    """Token ids of the documents concatenated, the EOS token (when the tokenizer has one) between them."""
    separator = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    stream: list[int] = []
    for document in documents:
        if stream:
            stream.extend(separator)
        stream.extend(tokenizer(document, add_special_tokens=False)["input_ids"])
    return stream


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
    documents = load_documents(spec, split)
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
