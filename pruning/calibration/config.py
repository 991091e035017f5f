"""The calibration configuration a pruning run minimises and the registry stores.

A calibration configuration (:class:`CalibrationConfig`) is an objective, a data source, a sample count, a
sequence length and a seed. Any objective pairs with any data source of the kind it needs, so the study's
cross-controls (margin on text? perplexity on questions' data?) are one flag away. Importable without torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from depthprune.core.errors import UserError
from depthprune.core.objectives import TEXT, Objective, get_objective
from pruning.calibration.data.items import SAMPLINGS
from pruning.calibration.data.specs import parse_spec


def check_data_kind(objective: Objective, spec: str) -> None:
    """Raise a :class:`UserError` when the data spec is of the wrong kind for ``objective``."""
    kind = parse_spec(spec).kind
    if kind != objective.data_kind:
        wanted = (
            "text (e.g. demo:text, c4, text:PATH)"
            if objective.data_kind == TEXT
            else "multiple-choice questions (e.g. demo:qa, commonsense170k, mc:PATH)"
        )
        raise UserError(
            f"objective {objective.name!r} needs {wanted}, but data {spec!r} is {kind.replace('_', '-')}"
        )


@dataclass
class CalibrationConfig:
    """A calibration configuration: what a pruning run minimises, and on which data.

    ``dataclasses.asdict`` of it is what the registry stores.
    """

    objective: str
    """A key of :data:`~depthprune.core.objectives.OBJECTIVES`: ``perplexity``, ``task_margin``, ``kl``."""
    data: str
    """A data spec (:mod:`pruning.calibration.data`): ``c4``, ``wikitext2``, ``lambada``, ``commonsense170k``
    (``commonsense170k:PATH`` for a local copy), ``pydoc``, ``pydoc-cloze``, ``demo:text``, ``demo:qa``,
    ``text:PATH`` or ``mc:PATH``; its kind must suit the objective."""
    samples: int = 64
    """Calibration samples: text instances, or multiple-choice items (the study uses 64)."""
    seq_len: int = 2048
    """Tokens per text instance; the longest a question plus answer may be (the study truncates to 2048)."""
    seed: int = 0
    """Seed of the sample draw."""
    sampling: str = "documents"
    """Text only: ``documents`` (one document per instance, truncated to ``seq_len``, shorter ones skipped:
    the study's and SLEB's way) or ``stream`` (random windows of all documents joined, SparseGPT's). See
    :mod:`pruning.calibration.data`."""

    def __post_init__(self):
        check_data_kind(get_objective(self.objective), self.data)
        if self.sampling not in SAMPLINGS:
            raise UserError(f"unknown sampling {self.sampling!r}; use one of {', '.join(SAMPLINGS)}")
        for name, lowest in (("samples", 1), ("seq_len", 2), ("seed", 0)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < lowest:
                raise UserError(f"calibration {name} must be an integer >= {lowest}, got {value!r}")

    @property
    def kind(self) -> str:
        """The data kind, ``"text"`` or ``"multiple_choice"``."""
        return self.calibration_objective.data_kind

    @property
    def calibration_objective(self) -> Objective:
        """The :class:`~depthprune.core.objectives.Objective` named by :attr:`objective`, with its facts."""
        return get_objective(self.objective)
