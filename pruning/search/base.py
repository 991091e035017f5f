"""The contract between the searches and whatever scores a removal set, plus what every search shares.

A search sees only a :class:`SubsetObjective`: it never touches a model (model plumbing lives in
:mod:`pruning.model.blocks`). The real implementation is
:class:`pruning.calibration.scoring.evaluator.SubsetEvaluator`; tests use small synthetic objectives.

Every algorithm in this package is one function with one signature, the :class:`Search` interface::

    search(objective: SubsetObjective, budget: int, *, seed: int = 0, progress: bool = True,
           **options) -> SearchResult

A module writes only what is its own: its ``Options`` (a :class:`SearchOptions`, whose fields declare their
checks: :func:`integer`, :func:`integers`, :func:`one_of`, :func:`flag`) and the body of its search, made
the shared signature by :func:`define_search`, which parses the options (an unknown or invalid one is a
one-line :class:`~ground.core.errors.UserError`) and checks the budget first. The settings as used are
returned in ``SearchResult.options``.

Searches that score many sets at once, or need only a ranking, go through :func:`score_many`,
:func:`rank_lowest` and :func:`rank_prior`: the evaluator answers them with exact shortcuts (shared prefix
states, lower bounds for candidates that cannot be chosen, see :class:`RankingObjective`), any other
objective one :meth:`~SubsetObjective.score` per set.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol, TypeVar, runtime_checkable

import numpy as np

from ground.core.errors import UserError
from ground.core.objectives import Objective


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
class CalibratedObjective(Protocol):
    """Optional extension: the facts of the calibration objective behind the scores.

    Searches ask these facts (e.g. ``zero_gradient_at_dense``), never the objective's name; synthetic
    objectives do not implement it.
    """

    @property
    def calibration_objective(self) -> Objective:
        """The :class:`~ground.core.objectives.Objective` the scores are losses of."""


@runtime_checkable
class ScreeningObjective(Protocol):
    """Optional extension: a cheap, noisier estimate of :meth:`SubsetObjective.score`.

    EvoPress screens its offspring on a small fraction of the calibration tokens and spends the full
    calibration set only on the survivors. An objective that can do that implements this method.
    """

    def screen_score(self, removed_blocks: frozenset[int]) -> float:
        """Calibration loss of ``removed_blocks`` on a small part of the calibration data."""


@runtime_checkable
class SampleScoringObjective(Protocol):
    """Optional extension: the loss on a chosen part of the calibration data (EvoPress's minibatches).

    EvoPress selects in steps, each on a fresh random minibatch of the calibration data: few tokens to
    screen all offspring, more for the survivors. An objective that can score a removal set on a subset of
    its calibration samples implements this; :mod:`pruning.search.evolution` draws the subsets.
    """

    num_samples: int
    """Calibration samples (text windows or questions) the full loss averages over."""

    def score_samples(self, removed_blocks: frozenset[int], samples: list[int]) -> float:
        """Mean per-sample calibration loss of ``removed_blocks`` over the calibration samples ``samples``
        (indices in ``0..num_samples-1``); equal to :meth:`SubsetObjective.score` when all are given."""


class RankedScore(NamedTuple):
    """One answer of a ranking query."""

    loss: float
    """The set's loss when ``exact``, else a lower bound of it."""
    exact: bool
    """False for a set that cannot be among the lowest asked for: its scoring stopped at a bound."""


@runtime_checkable
class RankingObjective(Protocol):
    """Optional extension: batches of sets, and rankings that need not every loss in full.

    :class:`pruning.calibration.scoring.evaluator.SubsetEvaluator` implements it; :func:`score_many`,
    :func:`rank_lowest` and :func:`rank_prior` fall back to :meth:`SubsetObjective.score` without it.
    """

    def score_many(self, removed_sets: list[frozenset[int]]) -> list[float]:
        """``score`` of each set (computed together, sharing what the sets share)."""

    def rank_lowest(
        self, removed_sets: list[frozenset[int]], keep: int, bases: tuple = ()
    ) -> list[tuple[float, bool]]:
        """Per set ``(loss, True)``, or ``(lower bound, False)`` for a set that is not among the ``keep``
        lowest; ``bases`` are sets the candidates extend by one block."""

    def rank_single_blocks(self, keep: int) -> list[tuple[float, bool]]:
        """``rank_lowest`` of the N single-block sets (the prior), exact for the ``keep`` lowest."""


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


@runtime_checkable
class Search(Protocol):
    """What every search is: one signature and three facts (:func:`define_search` makes a module's body one).
    ``pruning.search.SEARCHES`` checks each against it on loading."""

    options_class: type
    """The dataclass its keyword options are parsed into (a :class:`SearchOptions`; its fields are the
    options' documentation)."""
    deterministic: bool
    """Whether its result is the same under every seed under the single-block prior: a study with a pinned
    calibration draw runs it once and reuses that cell for its other seeds."""
    check_objective: Callable[[Objective], None] | None
    """For a search that cannot run under some calibration objectives, ``check_objective(objective)`` raises
    a one-line UserError for those (asked before any model is loaded); else None."""

    def __call__(
        self, objective: SubsetObjective, budget: int, *, seed: int = 0, progress: bool = True, **options: Any
    ) -> SearchResult:
        """Choose ``budget`` blocks to remove.

        Args:
            objective: scores removal sets (lower is better); all a search may ask about the model.
            budget: M, the number of blocks to remove (1 <= M < N, and no more than the unprotected blocks).
            seed: seeds what the search draws; a search whose ``deterministic`` is True ignores it (but for
                a random prior).
            progress: show a progress bar over the search's long loops.
            **options: fields of the search's ``Options``; an unknown or invalid one is a UserError.

        Returns:
            The removal set (sorted), its calibration loss, the search's history and its options as used.
        """


PRIOR_KINDS = ("single_block", "random")
"""Values of the ``prior`` option of the prior-guided searches."""

PRIOR_USES = ("paper", "strong")
"""Values of the ``prior_use`` option of the genetic algorithm and BO: ``paper``, the prior only seeds the
initial population / the surrogate (the study's use); ``strong``, it also steers every mutation / repairs
every trial."""

PROTECT_NAMES = {"first": 0, "last": -1}
"""Names ``--protect`` accepts besides block indices: block 0 and block N−1 (SLEB's and LoRP's barriers)."""


def check_budget(objective: SubsetObjective, budget: int) -> None:
    """Raise a :class:`UserError` unless ``1 <= budget < N``."""
    num_blocks = int(objective.num_blocks)
    if isinstance(budget, bool) or not isinstance(budget, (int, np.integer)):
        raise UserError(f"the number of blocks to remove must be an integer, got {budget!r}")
    if not 1 <= budget < num_blocks:
        raise UserError(f"cannot remove {budget} of {num_blocks} blocks: choose 1 <= M < {num_blocks}")
    protected = protected_blocks(objective)
    if budget > num_blocks - len(protected):
        raise UserError(
            f"cannot remove {budget} of {num_blocks} blocks with blocks {sorted(protected)} protected: "
            f"choose M <= {num_blocks - len(protected)}"
        )


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


INTEGER_KINDS = {1: "a positive integer", 0: "a non-negative integer"}


def _is_integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def integer(default: int | None, *, minimum: int = 1, optional: bool = False) -> Any:
    """An ``Options`` field holding an integer >= ``minimum`` (None too when ``optional``)."""
    return field(default=default, metadata={"minimum": minimum, "optional": optional})


def integers(default: tuple[int, ...]) -> Any:
    """An ``Options`` field holding a non-empty list of positive integers (kept as a tuple; one integer is a
    list of one)."""
    return field(default=default, metadata={"integers": True})


def one_of(default: str, choices: tuple[str, ...]) -> Any:
    """An ``Options`` field holding one of ``choices``."""
    return field(default=default, metadata={"choices": tuple(choices)})


def flag(default: bool) -> Any:
    """An ``Options`` field holding true or false."""
    return field(default=default, metadata={"flag": True})


def check_field(item: dataclasses.Field, value: Any) -> Any:
    """``value`` of the ``Options`` field ``item`` as its helper declared it (:func:`integer`, ...), or a
    ValueError naming the field; a field without a helper is returned unchecked."""
    name, declared = item.name, item.metadata
    if "minimum" in declared:
        minimum, optional = declared["minimum"], declared["optional"]
        if not (value is None and optional) and not (_is_integer(value) and value >= minimum):
            kind = INTEGER_KINDS.get(minimum, f"an integer >= {minimum}") + (" or null" if optional else "")
            raise ValueError(f"{name} must be {kind}, got {value!r}")
    elif "integers" in declared:
        values = (value,) if _is_integer(value) else value
        valid = isinstance(values, (list, tuple)) and all(_is_integer(v) and v >= 1 for v in values)
        if not (valid and values):
            raise ValueError(f"{name} must be a non-empty list of positive integers, got {value!r}")
        return tuple(values)
    elif "choices" in declared and value not in declared["choices"]:
        raise ValueError(f"{name} must be one of {', '.join(declared['choices'])}, got {value!r}")
    elif "flag" in declared and not isinstance(value, bool):
        raise ValueError(f"{name} must be true or false, got {value!r}")
    return value


@dataclass
class SearchOptions:
    """The base of every search's ``Options``: on construction each field is checked as its helper
    declares (:func:`integer`, :func:`integers`, :func:`one_of`, :func:`flag`), then :meth:`check` runs.
    Each field has a docstring: they are the options' documentation."""

    def __post_init__(self) -> None:
        for item in dataclasses.fields(self):
            setattr(self, item.name, check_field(item, getattr(self, item.name)))
        self.check()

    def check(self) -> None:
        """The search's own checks (ranges of floats, relations between fields): ValueError; none here."""


OptionsT = TypeVar("OptionsT", bound=SearchOptions)
SearchBody = Callable[[SubsetObjective, int, OptionsT, int, bool], SearchResult]
"""What a module writes: ``body(objective, budget, settings, seed, progress) -> SearchResult``."""


def define_search(
    options_class: type[OptionsT] = SearchOptions,
    *,
    deterministic: bool,
    check_objective: Callable[[Objective], None] | None = None,
) -> Callable[[SearchBody], Search]:
    """Decorator: a search's body, ``body(objective, budget, settings, seed, progress)``, as a
    :class:`Search`.

    The search parses its keyword options into ``options_class`` (:func:`parse_options`), checks the budget
    (:func:`check_budget`), then runs the body with the settings. It keeps the body's name, module and
    docstring; messages name it by its module (``greedy``).

    Args:
        options_class: the module's ``Options``; the default, for a search without settings, takes none.
        deterministic: the result is the same under every seed (under the single-block prior).
        check_objective: refuses the calibration objectives the search cannot run under (a UserError).

    Returns:
        The decorator.
    """

    def decorate(body: SearchBody) -> Search:
        algorithm = body.__module__.rpartition(".")[2]

        def search(
            objective: SubsetObjective, budget: int, *, seed: int = 0, progress: bool = True, **options: Any
        ) -> SearchResult:
            settings = parse_options(options_class, options, algorithm)
            check_budget(objective, budget)
            return body(objective, budget, settings, seed, progress)

        # Not functools.wraps: its __wrapped__ would make inspect.signature report the body's signature.
        for attribute in ("__module__", "__name__", "__qualname__", "__doc__"):
            setattr(search, attribute, getattr(body, attribute))
        search.options_class, search.deterministic = options_class, deterministic
        search.check_objective = check_objective
        return search

    return decorate


def check_prior_kind(prior: str) -> None:
    """A ValueError unless ``prior`` is one of :data:`PRIOR_KINDS` (the options' :func:`one_of` checks it
    in ``Options``; :func:`prior_scores` again, for direct callers)."""
    if prior not in PRIOR_KINDS:
        raise ValueError(f"prior must be one of {', '.join(PRIOR_KINDS)}, got {prior!r}")


def protected_blocks(objective: SubsetObjective) -> frozenset[int]:
    """Blocks no search may remove: the objective's ``protected`` (:class:`ProtectedObjective`), or none."""
    return frozenset(int(block) for block in getattr(objective, "protected", ()))


def eligible_blocks(objective: SubsetObjective) -> list[int]:
    """The blocks a search may remove, ascending: every block but the protected ones."""
    protected = protected_blocks(objective)
    return [block for block in range(int(objective.num_blocks)) if block not in protected]


def resolve_protected(names, num_blocks: int) -> frozenset[int]:
    """``--protect`` items (``first``, ``last`` or a block index) as block indices of an N-block model.

    Raises:
        UserError: an unknown name, an index out of range, or every block protected.
    """
    protected = set()
    for item in names:
        text = str(item).strip().lower()
        if text in PROTECT_NAMES:
            protected.add(PROTECT_NAMES[text] % num_blocks)
        elif text.isdigit() and int(text) < num_blocks:
            protected.add(int(text))
        else:
            raise UserError(
                f"--protect takes first, last or block indices 0..{num_blocks - 1}, got {str(item)!r}"
            )
    if len(protected) >= num_blocks:
        raise UserError(f"--protect would protect all {num_blocks} blocks")
    return frozenset(protected)


def prior_scores(objective: SubsetObjective, prior: str, seed: int) -> np.ndarray:
    """The ``[N]`` prior a prior-guided search ranks blocks by (lower = safer to remove).

    ``"single_block"`` is the study's prior, the single-block ablation losses (memoised by the evaluator,
    so every search of a configuration shares one computation). ``"random"`` is the control the study
    lacked: a seeded random permutation 0..N−1 (only its order carries meaning); it costs no evaluation.
    Under protection (:class:`ProtectedObjective`) the random ranking puts the protected blocks last.
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
    protected = protected_blocks(objective)
    if not protected:
        return rng.permutation(objective.num_blocks).astype(np.float64)
    # Protected blocks rank last, so that a search taking the lowest never reaches them.
    eligible = eligible_blocks(objective)
    scores = np.empty(objective.num_blocks)
    scores[eligible] = rng.permutation(len(eligible))
    scores[sorted(protected)] = np.arange(len(eligible), objective.num_blocks)
    return scores


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


def score_many(objective: SubsetObjective, removed_sets) -> list[float]:
    """``objective.score`` of each set, through the objective's ``score_many`` when it has one."""
    keys = [as_key(removed) for removed in removed_sets]
    if isinstance(objective, RankingObjective):
        return [float(loss) for loss in objective.score_many(keys)]
    return [float(objective.score(key)) for key in keys]


def rank_lowest(objective: SubsetObjective, removed_sets, keep: int, bases=()) -> list[RankedScore]:
    """Enough of each set's loss to tell the ``keep`` lowest (:meth:`RankingObjective.rank_lowest`).

    The ``keep`` lowest sets, and any set tied with them, come back ``exact``; the others may come back
    as a lower bound that is above the ``keep``-th lowest loss. Without a ranking objective every set is
    scored, in the order given.
    """
    keys = [as_key(removed) for removed in removed_sets]
    if isinstance(objective, RankingObjective):
        base_keys = tuple(as_key(base) for base in bases)
        return [
            RankedScore(float(loss), bool(exact))
            for loss, exact in objective.rank_lowest(keys, keep, base_keys)
        ]
    return [RankedScore(float(objective.score(key)), True) for key in keys]


def rank_prior(objective: SubsetObjective, keep: int) -> list[RankedScore]:
    """The single-block prior as a ranking: exact for the ``keep`` lowest blocks (and ties), possibly a
    lower bound for the others; all exact from an objective without ranking queries."""
    if isinstance(objective, RankingObjective):
        return [RankedScore(float(loss), bool(exact)) for loss, exact in objective.rank_single_blocks(keep)]
    return [RankedScore(float(loss), True) for loss in objective.single_block_scores()]


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
        self.stopped_early = 0
        """Ranking answers given as lower bounds (candidates whose scoring stopped early)."""
        self.started = time.perf_counter()

    def score(self, removed_blocks: frozenset[int]) -> float:
        key = as_key(removed_blocks)
        self.calls += 1
        self.requested.add(key)
        return float(self.objective.score(key))

    def single_block_scores(self) -> np.ndarray:
        self.used_prior = True
        return self.objective.single_block_scores()

    def score_many(self, removed_sets: list[frozenset[int]]) -> list[float]:
        keys = [as_key(removed) for removed in removed_sets]
        self.calls += len(keys)
        self.requested.update(keys)
        return score_many(self.objective, keys)

    def rank_lowest(
        self, removed_sets: list[frozenset[int]], keep: int, bases: tuple = ()
    ) -> list[RankedScore]:
        keys = [as_key(removed) for removed in removed_sets]
        self.calls += len(keys)
        self.requested.update(keys)
        ranked = rank_lowest(self.objective, keys, keep, bases)
        self.stopped_early += sum(not answer.exact for answer in ranked)
        return ranked

    def rank_single_blocks(self, keep: int) -> list[RankedScore]:
        self.used_prior = True
        ranked = rank_prior(self.objective, keep)
        self.stopped_early += sum(not answer.exact for answer in ranked)
        return ranked

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
        attribute = getattr(self.objective, name)
        # Sets scored on a minibatch (EvoPress's screen) were asked for too. Wrapped here rather than
        # defined as methods, so that the tracker offers them only when the objective does.
        if name == "score_samples":

            def score_samples(removed_blocks, samples):
                key = as_key(removed_blocks)
                self.calls += 1
                self.requested.add(key)
                return attribute(key, samples)

            return score_samples
        if name == "score_samples_many":

            def score_samples_many(removed_sets, samples):
                keys = [as_key(removed) for removed in removed_sets]
                self.calls += len(keys)
                self.requested.update(keys)
                return attribute(keys, samples)

            return score_samples_many
        # Other optional extensions (screen_score, dense_loss, ...) pass straight through.
        return attribute

    @property
    def subset_evaluations(self) -> int:
        """Distinct removal sets this search asked to score (the N single-block sets count when the
        search used the prior, since that is what the prior costs)."""
        requested = set(self.requested)
        if self.used_prior:
            requested.update(frozenset({block}) for block in range(self.num_blocks))
        return len(requested)


class ProtectedObjective:
    """A view of an objective under which the ``protected`` blocks are never removed (``--protect``).

    Searches learn the protected blocks from ``objective.protected`` (:func:`protected_blocks`) and draw
    from :func:`eligible_blocks`; :func:`check_budget` refuses M > N − |protected|. Searches that enumerate
    every candidate and rank them (greedy, beam, exhaustive, one-shot) need no change: a ranking answers a
    set that removes a protected block with ``RankedScore(inf, exact=False)``, never scoring it, so it is
    never among the lowest. Asking for the plain score of such a set is a bug of the search: ValueError.
    Everything else passes through to the wrapped objective (wrap it around a :class:`TrackedObjective`,
    so that the tracker counts only the sets actually scored).
    """

    def __init__(self, objective: SubsetObjective, protected):
        self.objective = objective
        self.num_blocks = int(objective.num_blocks)
        self.protected = frozenset(int(block) for block in protected)
        if not all(0 <= block < self.num_blocks for block in self.protected):
            raise ValueError(
                f"protected blocks {sorted(self.protected)} out of range 0..{self.num_blocks - 1}"
            )

    def _feasible(self, removed_blocks) -> frozenset[int]:
        key = as_key(removed_blocks)
        if key & self.protected:
            raise ValueError(
                f"a search asked to score a set removing protected block(s) {sorted(key & self.protected)}"
            )
        return key

    def score(self, removed_blocks: frozenset[int]) -> float:
        return float(self.objective.score(self._feasible(removed_blocks)))

    def score_many(self, removed_sets: list[frozenset[int]]) -> list[float]:
        return score_many(self.objective, [self._feasible(removed) for removed in removed_sets])

    def rank_lowest(
        self, removed_sets: list[frozenset[int]], keep: int, bases: tuple = ()
    ) -> list[RankedScore]:
        keys = [as_key(removed) for removed in removed_sets]
        feasible = [key for key in dict.fromkeys(keys) if not key & self.protected]
        answers = dict(zip(feasible, rank_lowest(self.objective, feasible, keep, bases))) if feasible else {}
        return [answers.get(key, RankedScore(math.inf, False)) for key in keys]

    def rank_single_blocks(self, keep: int) -> list[RankedScore]:
        # Exact for the keep + |protected| lowest of all blocks, hence for the keep lowest eligible ones.
        ranked = rank_prior(self.objective, min(keep + len(self.protected), self.num_blocks))
        return [
            RankedScore(math.inf, False) if block in self.protected else answer
            for block, answer in enumerate(ranked)
        ]

    def __getattr__(self, name: str):
        # The prior, gradients, similarities and optional extensions pass straight through.
        return getattr(self.objective, name)
