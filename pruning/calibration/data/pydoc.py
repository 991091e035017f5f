"""``pydoc`` / ``pydoc-cloze``: real data that installs with Python itself, text and multiple choice, offline.

Provenance. Every CPython ships the reference documentation's topics as ``pydoc_data.topics.topics``
(the text ``help("assert")`` prints): a dict of about 80 topics (``"assert"``, ``"specialnames"``,
``"formatstrings"``, ...) to plain-text English prose with code examples, about 460 KB in all, written by the
Python documentation authors under the PSF licence. Nothing here is generated or downloaded; the text is
whatever the running interpreter carries, so it changes a little between Python versions (the counts below
are CPython 3.11's).

Deduplication. Some topics contain others verbatim (``compound`` holds ``if``, ``for``, ``try``, ...;
``specialnames`` holds ``customization`` and ``attribute-access``): about a fifth of the text occurs more
than once. Each distinct paragraph (blank-line separated, compared with whitespace collapsed) is kept only in
the longest topic that contains it (ties: the first name in sort order), so no paragraph is in two documents
and none can be in two splits.

Documents (``pydoc``). A topic's kept paragraphs, in their order, are grouped into documents of at most
``MAX_DOCUMENT_CHARS`` (4,000) characters, about 1,000 tokens: a long topic becomes several documents, cut
only at blank lines; a paragraph longer than that is a document of its own. Documents are listed sorted by
topic name, then part, never in the order of the interpreter's dict.

Splits. A topic goes whole to one split, by a stable hash of its name alone: the first 8 bytes of
``sha256("pydoc:" + topic)`` as a fraction in [0, 1) — below 0.35 ``calibration``, below 0.65 ``heal``
(training text for a later healing step), else ``test``. A topic's split never depends on which other
topics a Python version has or their order, and documents of one topic (which share subject and phrasing)
never straddle splits. The bounds, fixed once, give each split about a third of the text although single
topics are large (``specialnames`` alone is 62 KB). On CPython 3.11.7, 78 of the 79 topics keep text after
deduplication: calibration 31 topics, 52 documents, 110 K characters; heal 18, 45, 118 K; test 29, 61,
146 K — 27,792 / 28,517 / 34,664 tokens with SmolLM2's tokenizer (EOS between documents), so the
calibration split holds 108 windows of 256 tokens or 13 of 2,048.

Cloze items (``pydoc-cloze``), LAMBADA-style. From each document's prose paragraphs (no code, grammar,
tables or ``>>>`` sessions; at least 20 words, 75 % of them plain words) a passage is a run of consecutive
sentences of one paragraph, 20 to 120 words, whose last sentence ends in ``" word."`` with ``word``
alphabetic, at least 3 letters (``etc`` excepted). The item's context is the passage cut right before that
final word; the correct choice is the word. Passages do not overlap; a context seen before in the split is
skipped. Three distractors are drawn from the other final words of the *same split* (never another
split's), of the same case shape (lower-case, Capitalised or other) and, where at least three exist, within
two letters of the answer's length; an answer whose shape has fewer than three other words in the split
gives no item. The draw and the choice order are seeded per item by ``CLOZE_SEED`` and the item's document
and position, so the items are identical on every run. On CPython 3.11.7: 222 / 249 / 341 items
(calibration / heal / test).

Use: ``depthprune prune --data pydoc`` / ``--data pydoc-cloze``; ``depthprune eval ... --suite offline``.
:func:`split_counts` prints the counts of the running Python.
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass
from functools import lru_cache

from ground.core.errors import UserError
from pruning.calibration.data.items import MULTIPLE_CHOICE, TEXT, ChoiceItem, DataSpec, Source

PYDOC_SPLITS = ("calibration", "heal", "test")
"""The splits of the pydoc sources; every topic is in exactly one."""
SPLIT_UPPER_BOUNDS = (("calibration", 0.35), ("heal", 0.65), ("test", 1.0))
"""A topic whose name hashes to a fraction below the bound (and above the previous one) is in that split."""
MAX_DOCUMENT_CHARS = 4000
"""Documents are cut at blank lines to at most this many characters (about 1,000 tokens)."""
CLOZE_MIN_WORDS, CLOZE_MAX_WORDS = 20, 120
"""Passage length in words, final word included."""
CLOZE_DISTRACTORS = 3
CLOZE_SEED = 0
"""Seed of the distractor draw and the choice order (mixed with each item's document and position)."""

_FINAL_WORD = re.compile(r"(?:^|\s)([A-Za-z]{3,})\.$")
# Abbreviations that end a sentence in a way no reader would guess as a word.
_NOT_FINAL_WORDS = {"etc"}
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z“\"(])")
_PLAIN_WORD = re.compile(r"^[(“\"‘]?[A-Za-z][A-Za-z'’-]*[)”\"’.,;:!?]*$")
_CODE_MARKERS = (">>>", "::=", "+--", "|", "...:")


@dataclass(frozen=True)
class PydocDocument:
    """One document of the pydoc text: a topic, or a blank-line-cut part of a long one."""

    topic: str
    """The ``pydoc_data.topics`` key it comes from."""
    part: int
    """Position among the topic's documents, from 0."""
    split: str
    """``calibration``, ``heal`` or ``test`` (the topic's)."""
    text: str
    """The paragraphs, joined by blank lines."""

    @property
    def document_id(self) -> str:
        """``topic#part``, stable across Python versions that keep the topic."""
        return f"{self.topic}#{self.part}"


@dataclass(frozen=True)
class ClozePassage:
    """A passage cut right before its final word."""

    document_id: str
    """The document it comes from."""
    context: str
    """The passage up to (not including) its final word, no trailing space."""
    answer: str
    """The passage's true final word."""


def topic_split(topic: str) -> str:
    """The split of a topic, from a stable hash of its name alone (see the module docstring)."""
    digest = hashlib.sha256(f"pydoc:{topic}".encode()).digest()
    fraction = int.from_bytes(digest[:8], "big") / 2**64
    return next(split for split, bound in SPLIT_UPPER_BOUNDS if fraction < bound)


def check_split(split: str) -> None:
    """Raise a one-line :class:`UserError` unless ``split`` is a pydoc split."""
    if split not in PYDOC_SPLITS:
        raise UserError(f"unknown split {split!r} of the pydoc data; use one of {', '.join(PYDOC_SPLITS)}")


def pydoc_topics() -> dict[str, str]:
    """``pydoc_data.topics.topics`` of the running Python.

    Raises:
        UserError: this Python was installed without ``pydoc_data`` (some distributions split it out).
    """
    try:
        from pydoc_data.topics import topics
    except ImportError:
        raise UserError(
            "this Python has no pydoc_data module (the documentation topics of the standard library); "
            "install the full standard library (e.g. Debian's libpython3-stdlib) or use text:PATH / mc:PATH"
        ) from None
    return dict(topics)


def _paragraphs(text: str) -> list[str]:
    return [paragraph.rstrip() for paragraph in re.split(r"\n\s*\n", text) if paragraph.strip()]


def _collapsed(paragraph: str) -> str:
    return " ".join(paragraph.split())


def owned_paragraphs(topics: dict[str, str]) -> dict[str, list[str]]:
    """Each topic's paragraphs less those kept by a longer topic (every distinct paragraph is kept once)."""
    owner: dict[str, str] = {}
    for topic in sorted(topics, key=lambda name: (-len(topics[name]), name)):
        for paragraph in _paragraphs(topics[topic]):
            owner.setdefault(_collapsed(paragraph), topic)
    kept = {}
    for topic in sorted(topics):
        paragraphs = [p for p in _paragraphs(topics[topic]) if owner[_collapsed(p)] == topic]
        if paragraphs:
            kept[topic] = paragraphs
    return kept


def _group_paragraphs(paragraphs: list[str]) -> list[str]:
    """Consecutive paragraphs joined by blank lines into texts of at most ``MAX_DOCUMENT_CHARS``."""
    texts, current = [], []
    for paragraph in paragraphs:
        if current and len("\n\n".join([*current, paragraph])) > MAX_DOCUMENT_CHARS:
            texts.append("\n\n".join(current))
            current = []
        current.append(paragraph)
    if current:
        texts.append("\n\n".join(current))
    return texts


@lru_cache(maxsize=1)
def _all_documents() -> tuple[PydocDocument, ...]:
    documents = []
    for topic, paragraphs in owned_paragraphs(pydoc_topics()).items():  # sorted by topic name
        split = topic_split(topic)
        documents += [
            PydocDocument(topic, part, split, text) for part, text in enumerate(_group_paragraphs(paragraphs))
        ]
    return tuple(documents)


def pydoc_documents(split: str) -> list[PydocDocument]:
    """The documents of one split, sorted by topic name and part.

    Args:
        split: ``calibration``, ``heal`` or ``test``.

    Returns:
        The split's documents (their ``text`` is what the ``pydoc`` spec yields).
    """
    check_split(split)
    return [document for document in _all_documents() if document.split == split]


# ------------------------------------------------------------------------------------------------- cloze


def is_prose(paragraph: str) -> bool:
    """Running English text: no code, grammar, table or session markers, at least 75 % plain words."""
    if any(marker in paragraph for marker in _CODE_MARKERS):
        return False
    words = paragraph.split()
    if len(words) < CLOZE_MIN_WORDS:
        return False
    return sum(bool(_PLAIN_WORD.match(word)) for word in words) >= 0.75 * len(words)


def paragraph_passages(paragraph: str) -> list[tuple[str, str]]:
    """Non-overlapping ``(context, final word)`` passages of one prose paragraph (see the module doc)."""
    sentences = _SENTENCE_END.split(_collapsed(paragraph))
    passages, current = [], []
    for sentence in sentences:
        current.append(sentence)
        # A passage longer than the maximum drops its oldest sentences: the passage slides forward.
        while len(current) > 1 and sum(len(s.split()) for s in current) > CLOZE_MAX_WORDS:
            current.pop(0)
        words = sum(len(s.split()) for s in current)
        final = _FINAL_WORD.search(sentence)
        if not final or final.group(1).lower() in _NOT_FINAL_WORDS:
            continue
        if CLOZE_MIN_WORDS <= words <= CLOZE_MAX_WORDS:
            passage = " ".join(current)
            cut = len(passage) - len(sentence) + final.start(1)
            passages.append((passage[:cut].rstrip(), final.group(1)))
            current = []
    return passages


def cloze_passages(split: str) -> list[ClozePassage]:
    """Every passage of a split's prose, in document order, without repeated contexts."""
    passages, seen = [], set()
    for document in pydoc_documents(split):
        for paragraph in _paragraphs(document.text):
            if not is_prose(paragraph):
                continue
            for context, answer in paragraph_passages(paragraph):
                if context not in seen:
                    seen.add(context)
                    passages.append(ClozePassage(document.document_id, context, answer))
    return passages


def _shape(word: str) -> str:
    return "lower" if word.islower() else "title" if word.istitle() else "other"


def pick_distractors(answer: str, pool: list[str], rng: random.Random) -> list[str]:
    """``CLOZE_DISTRACTORS`` words of ``pool`` unlike the answer, of its case shape and, if enough, length.

    Args:
        answer: the correct word.
        pool: candidate words, distinct in lower case, sorted (the split's final words).
        rng: the item's random generator.

    Returns:
        The distractors, or fewer when the pool has too few words of the answer's shape.
    """
    same_shape = [w for w in pool if w.lower() != answer.lower() and _shape(w) == _shape(answer)]
    similar_length = [w for w in same_shape if abs(len(w) - len(answer)) <= 2]
    candidates = similar_length if len(similar_length) >= CLOZE_DISTRACTORS else same_shape
    return rng.sample(candidates, min(CLOZE_DISTRACTORS, len(candidates)))


@lru_cache(maxsize=len(PYDOC_SPLITS))
def _cloze_items(split: str) -> tuple[ChoiceItem, ...]:
    passages = cloze_passages(split)
    pool = sorted({passage.answer.lower(): passage.answer for passage in passages}.values())
    items, position = [], {}
    for passage in passages:
        index = position[passage.document_id] = position.get(passage.document_id, -1) + 1
        rng = random.Random(f"{CLOZE_SEED}:{passage.document_id}:{index}")
        distractors = pick_distractors(passage.answer, pool, rng)
        if len(distractors) < CLOZE_DISTRACTORS:
            continue  # a word shape too rare in this split to give three same-looking distractors
        choices = [passage.answer, *distractors]
        rng.shuffle(choices)
        items.append(ChoiceItem(passage.context, tuple(choices), choices.index(passage.answer)))
    return tuple(items)


def cloze_items(split: str) -> list[ChoiceItem]:
    """The ``pydoc-cloze`` items of one split (deterministic; see the module docstring).

    Args:
        split: ``calibration``, ``heal`` or ``test``.

    Returns:
        One :class:`ChoiceItem` per passage: the context, four choices, the index of the true final word.
    """
    check_split(split)
    return list(_cloze_items(split))


def split_counts() -> dict[str, dict[str, int]]:
    """Topics, documents, characters and cloze items per split, for the running Python."""
    counts = {}
    for split in PYDOC_SPLITS:
        documents = pydoc_documents(split)
        counts[split] = {
            "topics": len({document.topic for document in documents}),
            "documents": len(documents),
            "characters": sum(len(document.text) for document in documents),
            "cloze_items": len(cloze_items(split)),
        }
    return counts


if __name__ == "__main__":
    import json
    import sys

    print(f"Python {sys.version.split()[0]}: {json.dumps(split_counts(), indent=1)}")


def _pydoc_text(spec: DataSpec, split: str) -> list[str]:
    return [document.text for document in pydoc_documents(split)]


def _pydoc_cloze(spec: DataSpec, split: str) -> list[ChoiceItem]:
    return cloze_items(split)


PYDOC = Source(
    "pydoc",
    TEXT,
    "Python's documentation topics (pydoc_data, ships with CPython; offline)",
    _pydoc_text,
    heal_split=True,
)
PYDOC_CLOZE = Source(
    "pydoc-cloze",
    MULTIPLE_CHOICE,
    "cloze items from Python's documentation topics (offline)",
    _pydoc_cloze,
    heal_split=True,
)
