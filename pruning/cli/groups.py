"""The option groups of the ``prune`` and ``study`` commands, and the configs built from them.

typer needs every option in a command's signature; grouping the options here, as
:class:`pruning.runtime.plans.PlanRequest` groups the planning ones, keeps each command short: it builds each
group in one call and hands them to :func:`prune_config` or :func:`study_config`. Those parse and check the
options in the order the commands always have, so the first bad option is the one reported. Heavy modules
are imported inside the functions: :mod:`pruning.cli.commands` imports this module for ``depthprune --help``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pruning.calibration.config import CalibrationConfig
    from pruning.pipeline.prune import PruneConfig
    from pruning.study.plan import StudyConfig


def comma_list(text: str | None) -> tuple[str, ...]:
    """``"a, b,,c"`` -> ``("a", "b", "c")``."""
    return tuple(item.strip() for item in (text or "").split(",") if item.strip())


def suite_list(text: str) -> tuple[str, ...]:
    """``--suite`` of ``eval`` and ``study``: its items; an empty one is a one-line error."""
    from depthprune.core.lists import option_items

    return tuple(option_items(text, "--suite", "offline,mc:questions.jsonl"))


def integer_list(text: str, what: str) -> tuple[int, ...]:
    """Comma-separated integers of the option ``what``; a user error otherwise."""
    try:
        return tuple(int(item) for item in text.split(",") if item.strip())
    except ValueError:
        from depthprune.core.errors import UserError

        raise UserError(f"{what} must be integers separated by commas, got {text!r}") from None


@dataclass(frozen=True)
class SearchRequest:
    """The search options ``prune`` and ``study`` share, as typed on the command line."""

    searches: tuple[str, ...]
    """The searches to run, already parsed from ``--search`` / ``--searches``."""
    option: list[str] | None
    """``--option`` / ``-o``: ``KEY=VALUE`` or ``SEARCH.KEY=VALUE`` assignments."""
    protect: str | None
    """``--protect``: blocks no search may remove, comma-separated."""
    timing: str
    """``--timing``: how search costs are accounted."""

    def options(self) -> dict[str, dict]:
        """Per search name, its options from ``--option``."""
        from pruning.pipeline.prune import parse_option_assignments

        return parse_option_assignments(self.option or [], self.searches)

    def protected(self) -> tuple[str, ...]:
        """The protected blocks as a tuple."""
        return comma_list(self.protect)


@dataclass(frozen=True)
class Placement:
    """Where a command computes and where it writes its variants."""

    checkpoints: Path | None
    """Parent directory of the pruned checkpoints (``prune --out``, ``study --checkpoints``)."""
    registry: str | None
    """``--registry``: the registry URL."""
    dtype: str
    """The dtype, resolved from ``--dtype``."""
    device: str
    """The torch device, resolved from ``--device``."""


@dataclass(frozen=True)
class PruneRunOptions:
    """The ``prune`` options of one run beyond its calibration, searches and placement."""

    seed: int
    """``--seed``: seed of the search(es)."""
    random_prior: bool
    """``--random-prior``: a seeded random prior instead of the single-block one (control)."""
    memory_budget_gb: float | None
    """``--memory-budget-gb``: memory of the evaluator's boundary cache."""
    overwrite: bool
    """``--overwrite``: replace a checkpoint directory that holds a different removal set."""
    shortcuts: bool
    """``--shortcuts/--no-shortcuts``: the evaluator's exact shortcuts."""
    validation: str | None
    """``--validation``: held-out data every outcome is scored on."""
    max_ppl_ratio: float
    """``--max-ppl-ratio``: the quality gate's K."""


def prune_config(
    model: str,
    drop: int,
    calibration: CalibrationConfig,
    search: SearchRequest,
    placement: Placement,
    run: PruneRunOptions,
) -> PruneConfig:
    """The :class:`~pruning.pipeline.prune.PruneConfig` of one ``prune`` command line."""
    from pruning.pipeline.prune import PruneConfig

    return PruneConfig(
        model=model,
        calibration=calibration,
        drop=drop,
        searches=search.searches,
        seed=run.seed,
        random_prior=run.random_prior,
        options=search.options(),
        out=placement.checkpoints,
        registry_url=placement.registry,
        dtype=placement.dtype,
        device=placement.device,
        memory_budget_gb=run.memory_budget_gb,
        overwrite=run.overwrite,
        progress=True,
        shortcuts=run.shortcuts,
        protect=search.protected(),
        timing=search.timing,
        validation=run.validation,
        max_ppl_ratio=run.max_ppl_ratio,
    )


@dataclass(frozen=True)
class StudyGrid:
    """The ``study`` options that span its grid, as typed on the command line."""

    drop: str
    """``--drop``: budgets M, comma-separated."""
    objectives: str
    """``--objectives``: calibration objectives, comma-separated."""
    data: str | None
    """``--data``: calibration data specs, comma-separated."""
    seeds: str
    """``--seeds``: seeds, comma-separated."""
    data_seed: int | None
    """``--data-seed``: pin the calibration draw to this seed."""
    random_prior_control: bool
    """``--random-prior-control``: also run the prior-guided searches with a random prior."""
    cross_controls: bool
    """``--cross-controls``: every objective on every data source of its kind."""


@dataclass(frozen=True)
class StudyCalibration:
    """The ``study`` options that shape each calibration sample."""

    samples: int
    """``--samples``: calibration samples per configuration."""
    seq_len: int | None
    """``--seq-len``: calibration tokens per window."""
    choice_seq_len: int | None
    """``--choice-seq-len``: the longest question plus answer of multiple-choice objectives."""
    sampling: str
    """``--sampling``: documents or stream."""
    truncate: bool
    """``--truncate``: cut over-long multiple-choice items instead of refusing them."""
    margin_clip: float | None = None
    """``--margin-clip``: clip task_margin's per-item margin to [-TAU, TAU]."""


@dataclass(frozen=True)
class StudyEvaluation:
    """How ``study`` evaluates (and optionally heals) its variants."""

    suite: str
    """``--suite``: evaluation suites, comma-separated."""
    engine: str
    """``--engine``: auto, vllm or torch."""
    eval_limit: int | None
    """``--eval-limit``: at most N windows / documents per task."""
    eval_seq_len: int
    """``--eval-seq-len``: perplexity window of the evaluation."""
    heal: str | None
    """``--heal``: METHOD:STEPS, or None for no healing."""
    heal_data: str | None
    """``--heal-data``: text to heal on."""
    eval_windows: int | None = None
    """``--eval-windows``: at most N perplexity windows per task (None: ``eval_limit``)."""


@dataclass(frozen=True)
class StudyRunOptions:
    """How one ``study`` process runs and reports."""

    out: Path
    """``--out``: the report directory."""
    progress: bool
    """Show progress bars (not with ``--json``)."""
    worker: bool
    """``--worker``: share the grid through the registry's queue."""
    lease_seconds: float
    """``--lease-seconds``: when a killed worker's cell is taken over."""
    workers_per_gpu: int = 1
    """``--workers-per-gpu``: worker processes sharing one card (each plans for its share)."""
    keep_weights: str = "all"
    """``--keep-weights``: ``none`` deletes a variant's weights once it is evaluated."""


def study_config(
    model: str,
    grid: StudyGrid,
    calibration: StudyCalibration,
    search: SearchRequest,
    evaluation: StudyEvaluation,
    placement: Placement,
    run: StudyRunOptions,
) -> StudyConfig:
    """The :class:`~pruning.study.plan.StudyConfig` of one ``study`` command line."""
    from pruning.study.plan import StudyConfig

    return StudyConfig(
        model=model,
        drops=integer_list(grid.drop, "--drop"),
        objectives=comma_list(grid.objectives),
        searches=search.searches,
        data=comma_list(grid.data),
        seeds=integer_list(grid.seeds, "--seeds"),
        data_seed=grid.data_seed,
        random_prior_control=grid.random_prior_control,
        cross_controls=grid.cross_controls,
        samples=calibration.samples,
        seq_len=calibration.seq_len,
        choice_seq_len=calibration.choice_seq_len,
        sampling=calibration.sampling,
        truncate=calibration.truncate,
        margin_clip=calibration.margin_clip,
        options={name: value for name, value in search.options().items() if value},
        suites=suite_list(evaluation.suite),
        engine=evaluation.engine,
        eval_limit=evaluation.eval_limit,
        eval_windows=evaluation.eval_windows,
        eval_seq_len=evaluation.eval_seq_len,
        heal=evaluation.heal,
        heal_data=evaluation.heal_data,
        out=run.out,
        checkpoints=placement.checkpoints,
        registry_url=placement.registry,
        dtype=placement.dtype,
        device=placement.device,
        protect=search.protected(),
        timing=search.timing,
        progress=run.progress,
        worker=run.worker,
        lease_seconds=run.lease_seconds,
        workers_per_gpu=run.workers_per_gpu,
        keep_weights=run.keep_weights,
    )
