"""``pydoc-phrase``: multiple-choice items whose answers are multi-word phrases, from Python's documentation.

The cloze items of :mod:`.pydoc` end in one word, and 79 % of their choices are a single token: a task
objective on them is scored on one position per choice. Here each cloze passage of a split gives one item
whose correct choice is the passage's last :data:`PHRASE_WORDS` words (the final word and the words before
it, e.g. ``"the method resolution order"``) and whose context is the passage before them; the three
distractors are the final phrases of other passages of the *same split*, drawn with a seed mixed with the
item's document and position, so the items are identical on every run. Only phrases of plain words (letters,
apostrophes, hyphens; no punctuation) are used. A topic's split is :mod:`.pydoc`'s, so the ``calibration``,
``heal`` and ``test`` items never share a document, and the demo's held-out (``test``) items are disjoint from
everything calibration and validation see.
"""

from __future__ import annotations

import random
import re
from functools import lru_cache

from pruning.calibration.data.items import MULTIPLE_CHOICE, ChoiceItem, DataSpec, Source
from pruning.calibration.data.pydoc import CLOZE_DISTRACTORS, PYDOC_SPLITS, check_split, cloze_passages

PHRASE_WORDS = 4
"""Words in each answer phrase."""
PHRASE_SEED = 1
"""Seed of the distractor draw and the choice order (mixed with each item's document and position)."""
_PLAIN = re.compile(r"^[A-Za-z][A-Za-z'’-]*$")


def _phrase_passages(split: str) -> list[tuple[str, str, str]]:
    """``(document id, context, phrase)`` of every passage whose last words are plain."""
    found = []
    for passage in cloze_passages(split):
        words = passage.context.split()
        if len(words) < PHRASE_WORDS + 5:
            continue
        tail = words[-(PHRASE_WORDS - 1) :] + [passage.answer]
        if not all(_PLAIN.match(word) for word in tail):
            continue
        found.append((passage.document_id, " ".join(words[: -(PHRASE_WORDS - 1)]), " ".join(tail)))
    return found


@lru_cache(maxsize=len(PYDOC_SPLITS))
def _phrase_items(split: str) -> tuple[ChoiceItem, ...]:
    passages = _phrase_passages(split)
    phrases = sorted({phrase for _, _, phrase in passages})
    items, position = [], {}
    for document_id, context, phrase in passages:
        index = position[document_id] = position.get(document_id, -1) + 1
        rng = random.Random(f"{PHRASE_SEED}:{document_id}:{index}")
        others = [other for other in phrases if other.lower() != phrase.lower()]
        if len(others) < CLOZE_DISTRACTORS:
            continue
        choices = [phrase, *rng.sample(others, CLOZE_DISTRACTORS)]
        rng.shuffle(choices)
        items.append(ChoiceItem(context, tuple(choices), choices.index(phrase)))
    return tuple(items)


def phrase_items(split: str) -> list[ChoiceItem]:
    """The ``pydoc-phrase`` items of one split (deterministic; module docstring)."""
    check_split(split)
    return list(_phrase_items(split))


def _read(spec: DataSpec, split: str) -> list[ChoiceItem]:
    return phrase_items(split)


PYDOC_PHRASE = Source(
    "pydoc-phrase",
    MULTIPLE_CHOICE,
    "multi-word answer phrases from Python's documentation topics (offline)",
    _read,
    heal_split=True,
)
