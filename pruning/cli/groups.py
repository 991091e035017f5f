"""The configs the ``prune`` and ``study`` command lines build from their option groups.

The groups themselves are declared in :mod:`pruning.cli.options` (each option once); :func:`prune_config` and
:func:`study_config` parse and check them in the order the commands always have, so the first bad option is
the one reported. Heavy modules are imported inside the functions: :mod:`pruning.cli.commands` imports this
module for ``depthprune --help``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pruning.calibration.config import CalibrationConfig
    from pruning.cli import options
    from pruning.pipeline.config import PruneConfig
    from pruning.study.plan import StudyConfig


def comma_list(text: str | None) -> tuple[str, ...]:
    """``"a, b,,c"`` -> ``("a", "b", "c")``."""
    return tuple(item.strip() for item in (text or "").split(",") if item.strip())


def suite_list(text: str) -> tuple[str, ...]:
    """``--suite`` of ``eval`` and ``study``: its items; an empty one is a one-line error."""
    from ground.core.lists import option_items

    return tuple(option_items(text, "--suite", "offline,mc:questions.jsonl"))


def integer_list(text: str, what: str) -> tuple[int, ...]:
    """Comma-separated integers of the option ``what``; a user error otherwise."""
    try:
        return tuple(int(item) for item in text.split(",") if item.strip())
    except ValueError:
        from ground.core.errors import UserError

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


def prune_config(
    model: str,
    calibration: CalibrationConfig,
    search: SearchRequest,
    placement: Placement,
    run: Mapping[str, Any],
    memory_budget_gb: float | None,
) -> PruneConfig:
    """The :class:`~pruning.pipeline.config.PruneConfig` of one ``prune`` command line (``run``: the typed
    options of its own fields, ``--drop``, ``--seed``, ...)."""
    from pruning.pipeline.config import prune_config_from

    return prune_config_from(
        run,
        model=model,
        calibration=calibration,
        searches=search.searches,
        options=search.options(),
        out=placement.checkpoints,
        registry_url=placement.registry,
        dtype=placement.dtype,
        device=placement.device,
        memory_budget_gb=memory_budget_gb,
        progress=True,
        protect=search.protected(),
        timing=search.timing,
    )


def study_config(
    model: str,
    grid: options.StudyGridOptions,
    calibration: tuple[options.StudyCalibrationOptions, options.SamplingOptions, options.ItemOptions],
    search: SearchRequest,
    evaluation: options.EvaluationOptions,
    placement: Placement,
    run: options.StudyRunOptions,
    progress: bool,
) -> StudyConfig:
    """The :class:`~pruning.study.plan.StudyConfig` of one ``study`` command line."""
    from pruning.study.plan import StudyConfig

    sizes, sampling, items = calibration
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
        samples=sizes.samples,
        seq_len=sizes.seq_len,
        choice_seq_len=sizes.choice_seq_len,
        sampling=sampling.sampling,
        truncate=items.truncate,
        margin_clip=items.margin_clip,
        options={name: value for name, value in search.options().items() if value},
        suites=suite_list(evaluation.suite),
        engine=run.engine,
        eval_limit=evaluation.limit,
        eval_windows=evaluation.windows,
        eval_seq_len=evaluation.seq_len,
        heal=run.heal_spec,
        heal_data=run.heal_data,
        out=run.out,
        checkpoints=placement.checkpoints,
        registry_url=placement.registry,
        dtype=placement.dtype,
        device=placement.device,
        protect=search.protected(),
        timing=search.timing,
        progress=progress,
        worker=run.worker,
        lease_seconds=run.lease_seconds,
        workers_per_gpu=run.workers_per_gpu,
        keep_weights=run.keep_weights,
    )
