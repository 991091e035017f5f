"""The calibration objectives and what is known about each: the one registry, :data:`OBJECTIVES`.

An objective is what "the pruned model got worse" means, as one loss per calibration sample (lower is
better). This module holds only its *facts* — the data it scores, how low a per-sample loss can go, whether
its gradient vanishes at the dense model, its display name and the short names users type — so that the
server (which must not import ``pruning``) and the pruning pipeline read them from the same table. The loss
itself is computed by the module of the same name under ``pruning/calibration/objectives/``: its table
``pruning.calibration.objectives.LOSSES`` follows from this one.

Adding an objective is one new module plus one entry (docs/architecture.md, "Where to change what"):

1. ``pruning/calibration/objectives/<name>.py`` defining ``loss(batch, hidden, head, reference=None)``;
2. an entry ``"<name>": Objective("<name>", ...)`` in :data:`OBJECTIVES` below.

Every pipeline step, search, CLI help text and the server's synonyms follow from these two.
"""

from __future__ import annotations

from dataclasses import dataclass

from ground.core.registry_table import NamedTable

TEXT = "text"
"""Data kind: text documents, cut into windows or instances of ``seq_len`` tokens."""
MULTIPLE_CHOICE = "multiple_choice"
"""Data kind: multiple-choice questions (a context, choices, the correct one's index)."""
DATA_KINDS = (TEXT, MULTIPLE_CHOICE)


@dataclass(frozen=True)
class Objective:
    """One calibration objective's facts: one entry of :data:`OBJECTIVES`."""

    name: str
    """Its key in :data:`OBJECTIVES`, and the name of its loss module in ``pruning/calibration/objectives/``.
    """
    data_kind: str
    """The data kind it scores: :data:`TEXT` or :data:`MULTIPLE_CHOICE`."""
    display_name: str
    """How tables and reports name it, e.g. ``"task margin"``."""
    description: str
    """One line for ``--help`` and reports."""
    synonyms: tuple[str, ...] = ()
    """Short names users may write for it (``ppl``); the first also names its ``<short>-best`` alias."""
    loss_floor: float | None = None
    """A value no per-sample loss goes below, or None when there is none (a margin of any sign). Ranking
    queries stop scoring a candidate whose lower bound (scored samples plus this floor for the rest) exceeds
    the k-th best loss; without a floor every candidate is scored to the end."""
    zero_gradient_at_dense: bool = False
    """Whether the dense model is this objective's minimum, so its gradients there vanish (KL to the dense
    model): gradient-based searches (CBO) cannot run on it."""
    needs_reference: bool = False
    """Whether the loss compares against the dense model's next-token log-probabilities."""
    zero_loss_at_dense: bool = False
    """Whether the loss is exactly 0 at the dense model by definition (KL to itself): the dense reference
    pass then records 0 instead of computing it."""
    parameters: tuple[str, ...] = ()
    """Keyword parameters its loss takes, each a field of the calibration configuration of the same name
    (``margin_clip`` for ``task_margin``); a parameter left at None is not passed (the loss's default)."""

    def __post_init__(self):
        if self.data_kind not in DATA_KINDS:
            raise ValueError(f"objective {self.name!r}: data kind must be one of {DATA_KINDS}")

    @property
    def names(self) -> set[str]:
        """Every name of the objective: its own and its synonyms."""
        return {self.name, *self.synonyms}

    @property
    def short_name(self) -> str:
        """The shortest name users know it by: its first synonym, else its name (``ppl``, ``margin``)."""
        return self.synonyms[0] if self.synonyms else self.name


OBJECTIVES: NamedTable[Objective] = NamedTable(
    "objective",
    {
        "perplexity": Objective(
            "perplexity",
            TEXT,
            "perplexity",
            "mean next-token NLL on text",
            synonyms=("ppl",),
            # The per-token NLL is -log_softmax: never negative, in floating point too.
            loss_floor=0.0,
        ),
        "task_margin": Objective(
            "task_margin",
            MULTIPLE_CHOICE,
            "task margin",
            "negated PuDDing likelihood margin of the correct answer",
            synonyms=("margin", "task-margin"),
            # No floor unclipped (PuDDing's margin is unbounded); ``margin_clip`` TAU bounds it below by -TAU.
            parameters=("margin_clip",),
        ),
        "task_ce": Objective(
            "task_ce",
            MULTIPLE_CHOICE,
            "task cross-entropy",
            "length-normalised cross-entropy of the correct answer text",
            synonyms=("ce", "task-ce"),
            # A mean of -log_softmax over the answer tokens: never negative.
            loss_floor=0.0,
        ),
        "kl": Objective(
            "kl",
            TEXT,
            "KL divergence",
            "KL(dense || pruned) of the next-token distribution on text",
            # >= 0 in exact arithmetic; float32 rounding is orders of magnitude below -1e-3 per sample.
            loss_floor=-1e-3,
            zero_gradient_at_dense=True,
            needs_reference=True,
            zero_loss_at_dense=True,
        ),
    },
    interface=Objective,
)
"""Every calibration objective, by name: the one registry (module docstring: how to add one). A
:class:`~ground.core.registry_table.NamedTable` of :class:`Objective` entries, given as themselves."""


def get_objective(name: str) -> Objective:
    """The objective called ``name``.

    Raises:
        UserError: an unknown name (the message lists the objectives).
    """
    return OBJECTIVES[name]


def canonical_objective(name: str) -> str:
    """``ppl`` -> ``perplexity``, ``margin`` -> ``task_margin``; any other name unchanged."""
    for objective in OBJECTIVES.values():
        if name in objective.synonyms:
            return objective.name
    return name


def objective_names(canonical: str) -> set[str]:
    """Every name of an objective: its canonical name and its synonyms (just the name if unknown)."""
    objective = OBJECTIVES.get(canonical)
    return objective.names if objective is not None else {canonical}


def objectives_help() -> str:
    """The registered objectives for ``--help``: ``perplexity (mean next-token NLL on text), ...``."""
    return ", ".join(f"{name} ({objective.description})" for name, objective in OBJECTIVES.items())


KL_OBJECTIVE = "kl"
"""The objective whose per-sample loss ``--kl-weight`` adds to any other (its floor bounds the added term)."""


OBJECTIVE_PARAMETERS = ("margin_clip", "kl_weight")
"""Calibration-configuration fields that change what an objective measures (recorded only when set)."""
PARAMETER_LABELS = {"margin_clip": "clip", "kl_weight": "kl"}


def objective_label(calibration: dict) -> str:
    """A calibration record's objective with its parameters: ``task_margin``, ``task_margin-clip2-kl0.5``.

    Variant names and tables use it, so that two configurations of one objective never read alike."""
    label = str(calibration.get("objective", "objective"))
    for name in OBJECTIVE_PARAMETERS:
        value = calibration.get(name)
        if value not in (None, 0, 0.0):
            label += f"-{PARAMETER_LABELS[name]}{value:g}"
    return label


OBJECTIVE_FREE_SEARCHES = frozenset({"block_influence", "lorp", "streamline"})
"""Searches whose choice ignores the calibration objective (structural scores of the dense pass): their
variants never stand in for an objective's ``<short>-best`` alias (``tests/test_objectives.py`` checks the
names against ``pruning.search``)."""


def best_alias(objective: str) -> str:
    """The alias of an objective's best variant: ``ppl-best``, ``margin-best``, ``ce-best``."""
    return f"{get_objective(canonical_objective(objective)).short_name}-best"
