"""The calibration configuration a pruning run minimises and the registry stores.

A calibration configuration (:class:`CalibrationConfig`) is an objective, a data source, a sample count, a
sequence length and a seed. Any objective pairs with any data source of the kind it needs, so the study's
cross-controls (margin on text? perplexity on questions' data?) are one flag away. Importable without torch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ground.core.errors import UserError
from ground.core.objectives import KL_OBJECTIVE, OBJECTIVES, TEXT, Objective, get_objective
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
    """A key of :data:`~ground.core.objectives.OBJECTIVES`: ``perplexity``, ``task_margin``, ``kl``."""
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

    margin_clip: float | None = None
    """``task_margin`` only: clip each item's margin to [-TAU, TAU] (``--margin-clip TAU``), so that a search
    cannot buy a lower loss by driving the margin up on a few items while the model collapses; None =
    PuDDing's unbounded margin."""
    kl_weight: float = 0.0
    """LAMBDA of ``--kl-weight``: add LAMBDA x KL(dense || pruned) on the same sequences (for multiple choice,
    over the prompt and answer positions) to the objective's per-sample loss; 0 = none."""
    truncate: bool = False
    """Cut a multiple-choice item (prompt + answer) longer than ``seq_len`` from the left instead of refusing
    it (``--truncate``); the number cut is recorded (``truncated_items``). Text ``documents`` sampling takes
    each document's first ``seq_len`` tokens by definition (a window, not a truncated item)."""

    def __post_init__(self):
        objective = get_objective(self.objective)
        check_data_kind(objective, self.data)
        self._check_parameters(objective)
        if self.sampling not in SAMPLINGS:
            raise UserError(f"unknown sampling {self.sampling!r}; use one of {', '.join(SAMPLINGS)}")
        for name, lowest in (("samples", 1), ("seq_len", 2), ("seed", 0)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < lowest:
                raise UserError(f"calibration {name} must be an integer >= {lowest}, got {value!r}")

    def _check_parameters(self, objective: Objective) -> None:
        if self.margin_clip is not None:
            if "margin_clip" not in objective.parameters:
                raise UserError(f"--margin-clip applies to task_margin, not to objective {objective.name!r}")
            if isinstance(self.margin_clip, bool) or not self.margin_clip > 0:
                raise UserError(f"--margin-clip must be a number > 0, got {self.margin_clip!r}")
            self.margin_clip = float(self.margin_clip)
        if isinstance(self.kl_weight, bool) or not self.kl_weight >= 0:
            raise UserError(f"--kl-weight must be a number >= 0, got {self.kl_weight!r}")
        self.kl_weight = float(self.kl_weight)
        if self.kl_weight and objective.needs_reference:
            raise UserError(f"--kl-weight adds KL to another objective; {objective.name!r} is already one")

    def as_record(self) -> dict:
        """What the registry, ``pruning.json`` and run keys store: every field, the optional ones
        (``margin_clip``, ``kl_weight``, ``truncate``) only when set, so that earlier records keep their
        identity."""
        record = dataclasses.asdict(self)
        for name, default in (("margin_clip", None), ("kl_weight", 0.0), ("truncate", False)):
            if record[name] == default:
                del record[name]
        return record

    @classmethod
    def from_record(cls, record: dict) -> CalibrationConfig:
        """The configuration a registry record (:meth:`as_record`, plus what the run noted, such as
        ``truncated_items``) describes."""
        names = {item.name for item in dataclasses.fields(cls)}
        return cls(**{key: value for key, value in record.items() if key in names})

    @property
    def needs_reference(self) -> bool:
        """Whether scoring needs the dense model's log-probabilities (``kl``, or KL added to an objective)."""
        return self.calibration_objective.needs_reference or self.kl_weight > 0

    @property
    def loss_floor(self) -> float | None:
        """The floor of this configuration's per-sample loss (the objective's; -TAU for a clipped margin;
        plus LAMBDA times KL's floor with ``--kl-weight``), or None when it has none."""
        floor = self.calibration_objective.loss_floor
        if self.margin_clip is not None:
            floor = -self.margin_clip
        if self.kl_weight and floor is not None:
            floor += self.kl_weight * OBJECTIVES[KL_OBJECTIVE].loss_floor
        return floor

    @property
    def kind(self) -> str:
        """The data kind, ``"text"`` or ``"multiple_choice"``."""
        return self.calibration_objective.data_kind

    @property
    def calibration_objective(self) -> Objective:
        """The :class:`~ground.core.objectives.Objective` named by :attr:`objective`, with its facts."""
        return get_objective(self.objective)
