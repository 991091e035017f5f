"""The contract between the searches and whatever scores a removal set, plus what every search shares.

A search sees only a :class:`SubsetObjective`: it never touches a model (model plumbing lives in
:mod:`pruning.models`). The real implementation is :class:`pruning.calibration.scorer.SubsetEvaluator`; tests
use small synthetic objectives.

Every algorithm in this package is one function with one signature::

    search(objective: SubsetObjective, budget: int, *, seed: int = 0, progress: bool = True,
           **options) -> SearchResult

``budget`` is M, the number of blocks to remove. ``options`` are parsed into the algorithm's own
``Options`` dataclass (:func:`parse_options`), so an unknown or invalid option is a one-line
:class:`~depthprune.errors.UserError`, and the settings as used are returned in ``SearchResult.options``.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from depthprune.errors import UserError


@runtime_checkable
class SubsetObjective(Protocol):
    """What a search may ask of the calibration configuration."""

    num_blocks: int
    """N, the number of decoder blocks of the dense model."""

    def score(self, removed_blocks: frozenset[int]) -> float:
        """Calibration loss of the model with ``removed_blocks`` skipped (lower is better); memoised."""

    def single_block_scores(self) -> np.ndarray:
        """``[N]`` losses with exactly block i removed: the prior of one-shot, GA and BO, computed once."""

    def residual_gradients(self) -> np.ndarray:
        """``[m, N]`` per-sample gradients dL_s/dα_i of the loss w.r.t. a scalar α_i on block i's residual
        branch, at α = 1 (block output = h + α_i·f_i(h)): CBO's matrix A."""

    def block_influence(self) -> np.ndarray:
        """``[N]`` ShortGPT Block Influence, 1 − mean cos(h_in, h_out) per block on the calibration data."""

    def block_input_similarity(self) -> np.ndarray:
        """``[N, N]`` mean over calibration tokens of cos(input of block i, input of block j), unit diagonal:
        LoRP's similarity matrix (and LLM-Streamline's criterion, S[s, s + M])."""


@runtime_checkable
class ScreeningObjective(Protocol):
    """Optional extension: a cheap, noisier estimate of :meth:`SubsetObjective.score`.

    EvoPress screens its offspring on a small fraction of the calibration tokens and spends the full
    calibration set only on the survivors. An objective that can do that implements this method.
    """

    def screen_score(self, removed_blocks: frozenset[int]) -> float:
        """Calibration loss of ``removed_blocks`` on a small part of the calibration data."""


@dataclass
class SearchResult:
    """What every search returns."""

    removed_blocks: tuple[int, ...]
    """The chosen removal set, sorted."""
    loss: float
    """``objective.score(removed_blocks)``."""
    history: list[dict] = field(default_factory=list)
    """Per step or generation: what was tried and the best so far (for plots and resumption)."""
    options: dict = field(default_factory=dict)
    """The algorithm's settings as used (stored in the registry)."""


PRIOR_KINDS = ("single_block", "random")
"""Values of the ``prior`` option of the prior-guided searches."""


def check_budget(objective: SubsetObjective, budget: int) -> None:
    """Raise a :class:`UserError` unless ``1 <= budget < N``."""
    num_blocks = int(objective.num_blocks)
    if isinstance(budget, bool) or not isinstance(budget, (int, np.integer)):
        raise UserError(f"the number of blocks to remove must be an integer, got {budget!r}")
    if not 1 <= budget < num_blocks:
        raise UserError(f"cannot remove {budget} of {num_blocks} blocks: choose 1 <= M < {num_blocks}")


def parse_options(options_class: type, options: dict[str, Any], algorithm: str):
    """Build ``options_class(**options)``, turning unknown names and bad values into one-line UserErrors.

    Args:
        options_class: the algorithm's ``Options`` dataclass.
        options: keyword options given to ``search``.
        algorithm: the algorithm's name, for the message.

    Returns:
        The dataclass instance.
    """
    known = {item.name for item in dataclasses.fields(options_class)}
    unknown = sorted(set(options) - known)
    if unknown:
        allowed = ", ".join(sorted(known)) or "none"
        raise UserError(
            f"unknown option(s) for search {algorithm!r}: {', '.join(unknown)} (allowed: {allowed})"
        )
    try:
        return options_class(**options)
    except (TypeError, ValueError) as error:
        raise UserError(f"bad option for search {algorithm!r}: {error}") from None


def check_prior_kind(prior: str) -> None:
    """``__post_init__`` helper of the prior-guided searches' options."""
    if prior not in PRIOR_KINDS:
        raise ValueError(f"prior must be one of {', '.join(PRIOR_KINDS)}, got {prior!r}")


def prior_scores(objective: SubsetObjective, prior: str, seed: int) -> np.ndarray:
    """The ``[N]`` prior a prior-guided search ranks blocks by (lower = safer to remove).

    ``"single_block"`` is the study's prior, the single-block ablation losses (memoised by the evaluator,
    so every search of a configuration shares one computation). ``"random"`` is the control the study
    lacked: a seeded random permutation 0..N−1 (only its order carries meaning); it costs no evaluation.
    """
    check_prior_kind(prior)
    if prior == "single_block":
        scores = np.asarray(objective.single_block_scores(), dtype=np.float64)
        if scores.shape != (objective.num_blocks,):
            raise ValueError(
                f"single_block_scores() returned shape {scores.shape}, expected ({objective.num_blocks},)"
            )
        return scores
    # A distinct stream from the search's own generator, so that prior="random" with seed s does not
    # merely replay the search's random choices.
    rng = np.random.default_rng([seed, 0x5EED])
    return rng.permutation(objective.num_blocks).astype(np.float64)


def normalised_prior(scores: np.ndarray) -> np.ndarray:
    """Prior scores mapped to [0, 1] by rank (0 = the block whose removal hurts least).

    Ranks rather than raw losses because perplexity and margin losses live on very different scales and
    one catastrophic block (e.g. block 0) would otherwise flatten every other difference.
    """
    ranks = np.argsort(np.argsort(scores, kind="stable"), kind="stable")
    return ranks / max(len(scores) - 1, 1)


def removal_weights(scores: np.ndarray, temperature: float = 0.25) -> np.ndarray:
    """Sampling probabilities that favour blocks with a low prior: softmax(−rank / temperature)."""
    logits = -normalised_prior(scores) / temperature
    weights = np.exp(logits - logits.max())
    return weights / weights.sum()


def as_key(blocks) -> frozenset[int]:
    """A removal set as the evaluator's memo key (plain ints, so numpy ints never leak into JSON)."""
    return frozenset(int(block) for block in blocks)


def lowest(scores: np.ndarray, count: int) -> list[int]:
    """Indices of the ``count`` lowest scores, ties broken by the lower index (deterministic)."""
    return sorted(int(i) for i in np.argsort(scores, kind="stable")[:count])


def finish(objective: SubsetObjective, removed_blocks, history: list[dict], options: Any) -> SearchResult:
    """The :class:`SearchResult` for ``removed_blocks``, scored by the objective (a memo hit if seen)."""
    key = as_key(removed_blocks)
    options_dict = dataclasses.asdict(options) if dataclasses.is_dataclass(options) else dict(options)
    return SearchResult(
        removed_blocks=tuple(sorted(key)),
        loss=float(objective.score(key)),
        history=history,
        options=options_dict,
    )


class TrackedObjective:
    """Wraps an objective and counts what one search asked of it.

    The evaluator's own counters measure compute (block-forwards, distinct subsets actually run), which
    depends on what earlier searches already memoised. This wrapper measures the *search*: how many
    distinct removal sets it asked for, and whether it used the shared single-block prior, so a table of
    several searches on one evaluator stays comparable.
    """

    def __init__(self, objective: SubsetObjective):
        self.objective = objective
        self.num_blocks = int(objective.num_blocks)
        self.requested: set[frozenset[int]] = set()
        self.calls = 0
        self.used_prior = False
        self.used_gradients = False
        self.used_influence = False
        self.used_similarity = False
        self.started = time.perf_counter()

    def score(self, removed_blocks: frozenset[int]) -> float:
        key = as_key(removed_blocks)
        self.calls += 1
        self.requested.add(key)
        return float(self.objective.score(key))

    def single_block_scores(self) -> np.ndarray:
        self.used_prior = True
        return self.objective.single_block_scores()

    def residual_gradients(self) -> np.ndarray:
        self.used_gradients = True
        return self.objective.residual_gradients()

    def block_influence(self) -> np.ndarray:
        self.used_influence = True
        return self.objective.block_influence()

    def block_input_similarity(self) -> np.ndarray:
        self.used_similarity = True
        return self.objective.block_input_similarity()

    def __getattr__(self, name: str):
        # Optional extensions (screen_score, dense_loss, ...) pass straight through.
        return getattr(self.objective, name)

    @property
    def subset_evaluations(self) -> int:
        """Distinct removal sets this search asked to score (the N single-block sets count when the
        search used the prior, since that is what the prior costs)."""
        requested = set(self.requested)
        if self.used_prior:
            requested.update(frozenset({block}) for block in range(self.num_blocks))
        return len(requested)
