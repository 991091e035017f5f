"""The data's vocabulary: parsed specs, multiple-choice items, drawn samples, and what a source is.

Every other module of :mod:`pruning.calibration.data` builds on these; they read nothing themselves.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ground.core.errors import UserError
from ground.core.objectives import MULTIPLE_CHOICE, TEXT

SPLITS = ("calibration", "heal", "test")
SAMPLINGS = ("documents", "stream")
"""How text instances are cut: one document each (default), or windows of the joined stream."""
ANSWER_SCORING = "answer"
SENTENCE_SCORING = "sentence"
SCORINGS = (ANSWER_SCORING, SENTENCE_SCORING)
"""How a multiple-choice item's choices are scored (see :class:`ChoiceItem`)."""


@dataclass(frozen=True)
class DataSpec:
    """A parsed data spec string."""

    spec: str
    """The string as given, e.g. ``"demo:qa@/models/demo"``."""
    source: str
    """The source name: a key of :data:`~pruning.calibration.data.sources.SOURCES` (``"text"`` / ``"mc"``
    for the path specs; ``commonsense170k:PATH`` is source ``commonsense170k`` with a path)."""
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


@dataclass(frozen=True)
class Source:
    """One data source: an entry of :data:`~pruning.calibration.data.sources.SOURCES`."""

    name: str
    """Its key in ``SOURCES``: the spec's name (``c4``, ``demo:qa``) or its path prefix (``text``, ``mc``)."""
    kind: str
    """:data:`TEXT` or :data:`MULTIPLE_CHOICE`."""
    description: str
    """One line for help and error messages."""
    read: Callable[[DataSpec, str], list]
    """``read(spec, split)``: every document (text) or :class:`ChoiceItem` (multiple choice) of a split."""
    needs_path: bool = False
    """Only as ``NAME:PATH`` (a local file); no spec of the bare name."""
    path_prefix: bool = False
    """``NAME:PATH`` names a local file (``text:``, ``mc:``, ``commonsense170k:``)."""
    at_path: bool = False
    """``NAME@PATH`` is accepted (a demo model directory, a local Commonsense-170k copy)."""
    heal_split: bool = False
    """Has a ``heal`` split (training text for healing) besides ``calibration`` and ``test``."""

    @property
    def spec_forms(self) -> list[str]:
        """How specs name it, e.g. ``["text:PATH"]``, ``["commonsense170k", "commonsense170k:PATH"]``."""
        forms = [] if self.needs_path else [self.name]
        return forms + ([f"{self.name}:PATH"] if self.path_prefix else [])
