"""Prior-guided Bayesian optimisation on Optuna (the study's BO: 200 trials, 10 random initial trials).

**Subset encoding.** A trial suggests one continuous score ``u_i ∈ [0, 1]`` per block (parameters
``b00``, ``b01``, ...); the removal set is the M blocks with the highest ``u`` (ties: lower index).
Every point of the search space therefore decodes to a valid set of exactly M blocks, with no repair
step and no penalised infeasible region, and TPE can learn "block i tends to be removed" as a
per-dimension density. Many points decode to the same set; the evaluator's memo makes repeats free.

**How the prior seeds the study.** Before any sampled trial, ``prior_trials`` trials are enqueued:
the first sets ``u_i`` = 1 − rank_i (rank in [0, 1] by the prior, 0 = safest to remove), which decodes to
the one-shot solution; the others perturb that encoding by promoting the next-ranked blocks into the
removal set one at a time (the one-shot set with its M-th block swapped for the (M+j)-th), the
neighbourhood where one-shot's additivity assumption most likely errs. Then ``random_trials`` trials
are drawn at random (TPE's startup phase), then TPE proposes the rest, up to ``trials`` in total.
``prior="random"`` uses a seeded random ranking instead (the control).

**Resuming and parallel workers.** With ``storage`` (any Optuna storage URL: ``sqlite:///run.db``,
``postgresql+psycopg://...``) and ``study_name``, the study is created or loaded; the prior trials are
enqueued only when the study is new, and each worker stops once the study holds ``trials`` finished
trials, so an interrupted run resumes where it stopped and several processes can share one PostgreSQL
study. Each worker seeds its sampler with ``seed``; give parallel workers different seeds.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass

import numpy as np
from tqdm.auto import tqdm

from pruning.search.base import (
    SearchResult,
    SubsetObjective,
    as_key,
    check_budget,
    check_prior_kind,
    finish,
    normalised_prior,
    parse_options,
    prior_scores,
)


@dataclass
class Options:
    """Settings of prior-guided Bayesian optimisation (defaults: the study's)."""

    trials: int = 200
    """Total trials of the study (enqueued prior trials included)."""
    random_trials: int = 10
    """Random trials after the prior trials, before TPE takes over."""
    prior_trials: int = 4
    """Enqueued trials built from the prior: the one-shot set and its boundary swaps (0 = none)."""
    prior: str = "single_block"
    """``single_block`` (the study's prior) or ``random`` (a seeded random ranking: the control)."""
    storage: str | None = None
    """Optuna storage URL for resuming and parallel workers; None = in memory."""
    study_name: str | None = None
    """Study name in ``storage``; None = derived from M, seed and prior."""

    def __post_init__(self):
        check_prior_kind(self.prior)
        for name in ("trials", "random_trials", "prior_trials"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
        if self.trials < 1:
            raise ValueError("trials must be at least 1")


def param_name(block: int) -> str:
    """The Optuna parameter holding block ``block``'s removal score."""
    return f"b{block:02d}"


def decode(values: np.ndarray, budget: int) -> frozenset[int]:
    """The removal set encoded by per-block scores: the ``budget`` highest (ties: lower index)."""
    order = np.lexsort((np.arange(len(values)), -np.asarray(values)))
    return as_key(order[:budget])


def prior_encodings(scores: np.ndarray, budget: int, count: int) -> list[dict[str, float]]:
    """The enqueued trials: the one-shot encoding, then swaps of its M-th and (M+j)-th ranked blocks."""
    num_blocks = len(scores)
    base = 1.0 - normalised_prior(scores)
    order = list(np.argsort(-base, kind="stable"))
    encodings = []
    for swap in range(count):
        values = base.copy()
        if swap > 0:
            incoming = budget - 1 + swap
            if incoming >= num_blocks:
                break
            outgoing, promoted = order[budget - 1], order[incoming]
            values[outgoing], values[promoted] = values[promoted], values[outgoing]
        encodings.append({param_name(block): float(values[block]) for block in range(num_blocks)})
    return encodings


def search(objective: SubsetObjective, budget: int, *, seed: int = 0, progress: bool = True,
           **options) -> SearchResult:
    """Minimise the calibration loss with Optuna's TPE over the top-M encoding, seeded by the prior.

    Args:
        objective: scores removal sets (lower is better).
        budget: M, the number of blocks to remove.
        seed: seeds the TPE sampler (and a random prior).
        progress: show a progress bar over trials.
        **options: see :class:`Options`.

    Returns:
        The best removal set of the study, its loss, and one history entry per finished trial.
    """
    import optuna
    from optuna.trial import TrialState

    settings = parse_options(Options, options, "bayesian")
    check_budget(objective, budget)
    num_blocks = objective.num_blocks
    scores = prior_scores(objective, settings.prior, seed)
    study_name = settings.study_name or f"bayesian-n{num_blocks}-m{budget}-seed{seed}-{settings.prior}"

    optuna.logging.set_verbosity(logging.WARNING)
    prior_count = len(prior_encodings(scores, budget, settings.prior_trials))
    # n_startup_trials counts every finished trial, enqueued ones included: add them so that
    # `random_trials` truly random trials follow the prior ones.
    sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=prior_count + settings.random_trials)
    study = optuna.create_study(storage=settings.storage, study_name=study_name, direction="minimize",
                                sampler=sampler, load_if_exists=settings.storage is not None)
    if not study.trials:
        for encoding in prior_encodings(scores, budget, settings.prior_trials):
            study.enqueue_trial(encoding)

    def finished() -> int:
        return len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))

    def objective_function(trial) -> float:
        values = np.array([trial.suggest_float(param_name(block), 0.0, 1.0) for block in range(num_blocks)])
        removed = decode(values, budget)
        trial.set_user_attr("removed_blocks", sorted(removed))
        return objective.score(removed)

    done = finished()
    remaining = max(settings.trials - done, 0)
    with tqdm(total=settings.trials, initial=done, desc="bayesian", disable=not progress, leave=False) as bar:
        with warnings.catch_warnings():
            # TPE's multivariate mode is flagged experimental; the warning is noise for users.
            warnings.simplefilter("ignore", category=optuna.exceptions.ExperimentalWarning)
            if remaining:
                study.optimize(
                    objective_function,
                    n_trials=remaining,
                    callbacks=[optuna.study.MaxTrialsCallback(settings.trials, states=(TrialState.COMPLETE,)),
                               lambda _study, _trial: bar.update()],
                )

    completed = sorted(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)),
                       key=lambda trial: trial.number)
    history = []
    best: tuple[float, list[int]] | None = None
    for trial in completed:
        current = (float(trial.value), trial.user_attrs["removed_blocks"])
        best = current if best is None or current < best else best
        history.append({"trial": trial.number, "removed": current[1], "loss": current[0],
                        "best_loss": best[0]})
    result = finish(objective, best[1], history, settings)
    result.options["study_name"] = study_name
    return result
