"""The study grid: every (calibration, budget, search, seed) cell pruned, evaluated and reported.

``depthprune study --model M --drop 4,6 --objectives perplexity,task_margin --searches study`` runs here
(``--searches`` takes ``study``, the paper's seven, ``all``, those and the structural baselines, or names;
:func:`study_searches`):

1. :func:`plan_study` expands the grid and checks every cell (objective/data kinds, budgets, search options)
   before any weights are loaded;
2. :func:`run_study` takes each cell from the study's manifest (``cells.json`` in the report directory) or
   from the registry when an earlier run already produced it — a cell done is never recomputed — and runs
   the missing ones through :func:`pruning.prune.prune`, one call (one shared evaluator) per calibration
   configuration, budget, seed and prior;
3. every variant (and the dense model) is evaluated with :mod:`pruning.evaluation` unless the registry already
   holds those numbers;
4. with ``--heal lora:STEPS``, every distinct mask is healed and evaluated (:mod:`pruning.study.healing`);
5. :func:`pruning.study.report.write_report` writes the tables and figures.

Options beyond the study itself: several ``--seeds``; ``--random-prior-control`` re-runs the prior-guided
searches with a seeded random prior; ``--cross-controls`` runs every objective on every data source of its
kind given with ``--data`` (so objective and data are varied separately, which the study could not afford).

Scaling out: ``--worker`` runs the same grid as one of several workers (on one machine or many) that share
the registry as a work queue; see :mod:`pruning.study.worker`.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from depthprune.core.errors import UserError

DEFAULT_DATA = {"text": "c4", "multiple_choice": "commonsense170k"}
"""Calibration data per data kind for a hub model (the study's C4 and Commonsense-170k)."""
MANIFEST = "cells.json"
STUDY_BASELINES = ("block_influence", "lorp", "streamline")
"""What ``--searches all`` adds to the paper's seven: the structural baselines (ShortGPT's Block Influence,
LoRP, LLM-Streamline), which choose from hidden-state similarity and never look at the calibration loss."""


def study_searches(text: str) -> tuple[str, ...]:
    """``--searches``: ``study`` (the paper's seven, so every per-cell statistic is over n = 7), ``all`` (the
    seven and :data:`STUDY_BASELINES`), or names, comma-separated and mixable (``study,evolution``).

    Raises:
        UserError: an unknown name, or none.
    """
    from pruning.search import SEARCHES, STUDY_SEARCHES

    groups = {"study": STUDY_SEARCHES, "all": STUDY_SEARCHES + STUDY_BASELINES}
    names: list[str] = []
    for item in (part.strip() for part in text.split(",")):
        for name in groups.get(item, (item,) if item else ()):
            if name not in SEARCHES:
                raise UserError(f"unknown search {name!r}; choose from {', '.join(SEARCHES)}, study or all")
            if name not in names:
                names.append(name)
    if not names:
        raise UserError("no search given; name searches, or 'study' (the paper's seven) or 'all'")
    return tuple(names)


@dataclass
class StudyConfig:
    """One study: the grid, how to evaluate, where to write."""

    model: str
    """Hub id or local directory of the dense model."""
    drops: tuple[int, ...]
    """Budgets M (blocks removed)."""
    objectives: tuple[str, ...] = ("perplexity", "task_margin")
    """Calibration objectives (keys of ``depthprune.core.objectives.OBJECTIVES``)."""
    searches: tuple[str, ...] = ()
    """Search names; empty = the study's seven (``pruning.search.STUDY_SEARCHES``)."""
    data: tuple[str, ...] = ()
    """Calibration data specs; empty = demo data for the demo model, else C4 / Commonsense-170k. Each
    objective uses the first spec of its kind (every spec of its kind with ``cross_controls``)."""
    seeds: tuple[int, ...] = (0,)
    """Search seeds; each cell runs once per seed."""
    random_prior_control: bool = False
    """Also run the prior-guided searches with a seeded random prior instead of the single-block scores."""
    cross_controls: bool = False
    """Run every objective on every data source of its kind."""
    samples: int = 64
    """Calibration samples per configuration (the study: 64)."""
    seq_len: int | None = None
    """Calibration tokens per instance; None = min(2048, the model's context)."""
    sampling: str = "documents"
    """Text calibration instances: ``documents`` (one document each, the study's) or ``stream`` windows."""
    options: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per search name, search options (as ``prune --option``)."""
    suites: tuple[str, ...] = ("all",)
    """Evaluation suites (see :mod:`pruning.evaluation.suites`)."""
    engine: str = "auto"
    """Evaluation engine: ``auto``, ``vllm`` or ``torch``."""
    eval_limit: int | None = None
    """Evaluation limit per task (quick runs only)."""
    eval_seq_len: int = 2048
    """Perplexity window length of the evaluation (capped at the model's context)."""
    out: Path = Path("study")
    """Report directory (also holds the manifest ``cells.json``)."""
    checkpoints: Path | None = None
    """Parent directory of the pruned checkpoints; None = ``DEPTHPRUNE_HOME/variants``."""
    registry_url: str | None = None
    """Registry URL; None = the default."""
    dtype: str = "float32"
    """dtype of calibration scoring and evaluation."""
    device: str = "cpu"
    """torch device of the calibration evaluator."""
    progress: bool = True
    """Show progress bars."""
    timing: str = "standalone"
    """Search-cost accounting: ``standalone`` (each search on a cold evaluator, the study's Table 4) or
    ``shared`` (one evaluator per group of cells, marginal costs); see :mod:`pruning.prune`."""
    protect: tuple[str, ...] = ()
    """Blocks no search may remove (``first``, ``last``, indices); empty = none, the study's setting."""
    worker: bool = False
    """Work as one of several workers sharing the registry's queue of cells (:mod:`pruning.study.worker`)."""
    lease_seconds: float = 120.0
    """Worker mode: how long a claimed cell stays this worker's without a heartbeat (a killed worker's cell is
    taken over after this long)."""
    heal: str | None = None
    """``METHOD:STEPS`` (``lora:200``, ``distill:200``): heal every distinct mask and report before vs after
    healing (:mod:`pruning.study.healing`); None = no healing."""
    heal_data: str | None = None
    """Text spec to heal on; None = the study's text calibration data (see :mod:`pruning.study.healing`)."""

    def __post_init__(self):
        from pruning.calibration.objectives import get_objective
        from pruning.search import SEARCHES, STUDY_SEARCHES

        self.drops = tuple(sorted(set(self.drops)))
        if not self.drops or any(isinstance(m, bool) or not isinstance(m, int) or m < 1 for m in self.drops):
            raise UserError(f"--drop needs positive integers, e.g. 4,6; got {self.drops}")
        if not self.objectives:
            raise UserError("--objectives needs at least one objective")
        for objective in self.objectives:
            get_objective(objective)
        self.searches = tuple(self.searches) or STUDY_SEARCHES
        for search in self.searches:
            if search not in SEARCHES:
                raise UserError(f"unknown search {search!r}; choose from {', '.join(SEARCHES)} or all")
        if len(self.searches) < 2:
            raise UserError("a study compares searches: give at least two (or 'all')")
        self.seeds = tuple(dict.fromkeys(self.seeds))
        if not self.seeds or any(not isinstance(s, int) or s < 0 for s in self.seeds):
            raise UserError(f"--seeds needs non-negative integers, got {self.seeds}")
        if self.samples < 1:
            raise UserError(f"--samples must be positive, got {self.samples}")
        from pruning.prune import TIMINGS

        if self.timing not in TIMINGS:
            raise UserError(f"--timing must be one of {', '.join(TIMINGS)}, got {self.timing!r}")
        self.protect = tuple(str(item).strip() for item in self.protect if str(item).strip())
        if not self.lease_seconds > 0:
            raise UserError(f"--lease-seconds must be positive, got {self.lease_seconds}")
        from pruning.study.healing import check_heal_options

        check_heal_options(self)
        from pruning.calibration.data.items import SAMPLINGS

        if self.sampling not in SAMPLINGS:
            raise UserError(f"unknown --sampling {self.sampling!r}; use one of {', '.join(SAMPLINGS)}")
        self.out = Path(self.out).expanduser()


@dataclass(frozen=True)
class Cell:
    """One point of the grid."""

    calibration: Any
    """The :class:`pruning.calibration.config.CalibrationConfig`."""
    drop: int
    """M."""
    search: str
    """Search name."""
    seed: int
    """Search seed."""
    prior: str = "single_block"
    """``single_block`` (the study's prior) or ``random`` (the control)."""
    timing: str = "shared"
    """The study's search-cost accounting; a result of another accounting is not reused (not in the key)."""
    protected: tuple[int, ...] = ()
    """Blocks protected from removal; a result under other protection is not reused (not in the key)."""

    @property
    def key(self) -> str:
        """Stable identity of the cell (the manifest key)."""
        cal = self.calibration
        return (
            f"{cal.objective}|{cal.data}|{cal.samples}|{cal.seq_len}|{cal.seed}|{cal.sampling}|m{self.drop}|"
            f"{self.search}|seed{self.seed}|{self.prior}"
        )


@dataclass
class CellResult:
    """What a finished cell produced (one manifest entry)."""

    key: str
    objective: str
    data: str
    drop: int
    search: str
    seed: int
    prior: str
    removed_blocks: list[int]
    calibration_loss: float | None
    dense_loss: float | None
    search_seconds: float | None
    block_forwards: int | None
    subset_evaluations: int | None
    variant: str | None
    """Registry name of the variant."""
    checkpoint: str | None
    """Checkpoint directory."""
    metrics: dict[str, float] = field(default_factory=dict)
    """``"task/metric" -> value`` from the evaluation."""
    timing: str | None = None
    """Search-cost accounting of ``search_seconds`` (None: recorded before it was kept, i.e. ``shared``)."""
    protected: list[int] = field(default_factory=list)
    """Blocks that were protected from removal."""

    def matches(self, cell: Cell) -> bool:
        """Whether this result was produced under ``cell``'s accounting and protection."""
        return (self.timing or "shared") == cell.timing and list(self.protected) == list(cell.protected)


@dataclass
class StudyPlan:
    """The checked grid."""

    config: StudyConfig
    model: str
    num_blocks: int
    demo_dir: Path | None
    cells: list[Cell]


def _default_seq_len(model_config) -> int:
    return min(2048, int(getattr(model_config, "max_position_embeddings", 2048)))


def _calibrations(config: StudyConfig, data: list[str], seq_len: int) -> list:
    """The calibration configurations: each objective on the first ``data`` spec of its kind (on every one
    with ``cross_controls``).

    Raises:
        UserError: an objective has no data of its kind.
    """
    from pruning.calibration.config import CalibrationConfig
    from pruning.calibration.data.specs import parse_spec
    from pruning.calibration.objectives import get_objective

    kinds = {spec: parse_spec(spec).kind for spec in data}
    calibrations = []
    for objective in config.objectives:
        kind = get_objective(objective).data_kind
        matching = [spec for spec in data if kinds[spec] == kind]
        if not matching:
            raise UserError(
                f"objective {objective!r} needs {kind.replace('_', '-')} data; none in --data "
                f"{','.join(data)}"
            )
        for spec in matching if config.cross_controls else matching[:1]:
            calibrations.append(
                CalibrationConfig(
                    objective=objective,
                    data=spec,
                    samples=config.samples,
                    seq_len=seq_len,
                    seed=0,
                    sampling=config.sampling,
                )
            )
    return calibrations


def plan_study(config: StudyConfig) -> StudyPlan:
    """Expand and check the grid without loading weights.

    Raises:
        UserError: an impossible budget, data of the wrong kind, an unknown search option.
    """
    from depthprune.demo.paths import find_demo_dir
    from pruning.models import load_config
    from pruning.prune import PruneConfig, canonical_model, plan_prune
    from pruning.search import PRIOR_GUIDED
    from pruning.search.base import resolve_protected

    model = canonical_model(config.model)
    model_config = load_config(model)
    num_blocks = int(model_config.num_hidden_layers)
    too_big = [m for m in config.drops if m >= num_blocks]
    if too_big:
        raise UserError(
            f"cannot remove {too_big[0]} of {num_blocks} blocks: choose 1 <= --drop < {num_blocks}"
        )
    demo_dir = find_demo_dir(model)
    data = list(config.data)
    if not data:
        data = (
            [f"demo:text@{demo_dir}", f"demo:qa@{demo_dir}"]
            if demo_dir is not None
            else [DEFAULT_DATA["text"], DEFAULT_DATA["multiple_choice"]]
        )
    calibrations = _calibrations(config, data, config.seq_len or _default_seq_len(model_config))
    priors = ["single_block"] + (["random"] if config.random_prior_control else [])
    if config.random_prior_control and not PRIOR_GUIDED & set(config.searches):
        raise UserError(
            f"--random-prior-control needs a prior-guided search ({', '.join(sorted(PRIOR_GUIDED))})"
        )
    cells = []
    for calibration in calibrations:
        for drop in config.drops:
            for seed in config.seeds:
                for prior in priors:
                    searches = [s for s in config.searches if prior == "single_block" or s in PRIOR_GUIDED]
                    # prune's own checks (options, budgets, exhaustive limits) before anything heavy
                    plan_prune(
                        PruneConfig(
                            model=model,
                            calibration=calibration,
                            drop=drop,
                            searches=tuple(searches),
                            seed=seed,
                            random_prior=prior == "random",
                            options={s: config.options.get(s, {}) for s in searches},
                            out=config.checkpoints,
                            registry_url=config.registry_url,
                            dtype=config.dtype,
                            device=config.device,
                            progress=False,
                            timing=config.timing,
                            protect=config.protect,
                        )
                    )
                    protected = tuple(sorted(resolve_protected(config.protect, num_blocks)))
                    cells += [
                        Cell(calibration, drop, search, seed, prior, config.timing, protected)
                        for search in searches
                    ]
    return StudyPlan(config, model, num_blocks, demo_dir, cells)


# --------------------------------------------------------------------------------------------- manifest


def load_manifest(out: Path) -> dict[str, CellResult]:
    """Finished cells recorded in ``out/cells.json`` (empty when there is none)."""
    path = Path(out) / MANIFEST
    if not path.is_file():
        return {}
    try:
        rows = json.loads(path.read_text())
    except json.JSONDecodeError:
        raise UserError(
            f"{path} is not valid JSON; remove it to rebuild the study from the registry"
        ) from None
    return {row["key"]: CellResult(**row) for row in rows.get("cells", [])}


def save_manifest(out: Path, plan: StudyPlan, cells: dict[str, CellResult], dense: dict[str, float]) -> None:
    """Write the manifest atomically (a crash never leaves a truncated file)."""
    out.mkdir(parents=True, exist_ok=True)
    config = dataclasses.asdict(plan.config)
    config["out"], config["checkpoints"] = (
        str(plan.config.out),
        plan.config.checkpoints and str(plan.config.checkpoints),
    )
    payload = {
        "model": plan.model,
        "num_blocks": plan.num_blocks,
        "config": config,
        "dense": dense,
        "cells": [dataclasses.asdict(cells[cell.key]) for cell in plan.cells if cell.key in cells],
    }
    temporary = out / f".{MANIFEST}.tmp"
    temporary.write_text(json.dumps(payload, indent=1, default=str))
    temporary.replace(out / MANIFEST)


def _prior_of(options: dict) -> str:
    return "random" if options.get("prior") == "random" else "single_block"


def find_in_registry(registry, model: str, cell: Cell) -> CellResult | None:
    """A registered variant produced by exactly this cell (calibration, M, search, seed, prior), if any."""
    wanted = dataclasses.asdict(cell.calibration)
    try:
        variants = registry.list_variants(model)
    except UserError:  # base model not registered yet: nothing was pruned
        return None
    for variant in reversed(variants):  # newest first
        options = variant.search_options or {}
        if (
            variant.search == cell.search
            and variant.calibration == wanted
            and len(variant.removed_blocks) == cell.drop
            and cell.seed in options.get("seeds", [options.get("seed")])
            and _prior_of(options) == cell.prior
            and (options.get("timing") or "shared") == cell.timing
            and options.get("protected", []) == list(cell.protected)
            and variant.checkpoint_path
            and Path(variant.checkpoint_path).is_dir()
        ):
            return result_of_variant(cell, variant)
    return None


def result_of_variant(cell: Cell, variant) -> CellResult:
    """The result of ``cell`` as the registry recorded it (``variant``: a :class:`registry.VariantInfo`)."""
    return _cell_result(
        cell,
        variant.removed_blocks,
        variant.calibration_loss,
        variant.dense_loss,
        variant.search_seconds,
        variant.block_forwards,
        variant.subset_evaluations,
        variant.name,
        variant.checkpoint_path,
    )


def _cell_result(
    cell: Cell, removed, loss, dense_loss, seconds, forwards, subsets, name, checkpoint
) -> CellResult:
    return CellResult(
        key=cell.key,
        objective=cell.calibration.objective,
        data=cell.calibration.data,
        drop=cell.drop,
        search=cell.search,
        seed=cell.seed,
        prior=cell.prior,
        removed_blocks=sorted(int(i) for i in removed),
        calibration_loss=loss,
        dense_loss=dense_loss,
        search_seconds=seconds,
        block_forwards=forwards,
        subset_evaluations=subsets,
        variant=name,
        checkpoint=checkpoint,
        timing=cell.timing,
        protected=list(cell.protected),
    )


# ------------------------------------------------------------------------------------------------ running


def _group_missing(missing: list[Cell]) -> list[tuple[Cell, list[Cell]]]:
    """Missing cells grouped by (calibration, M, seed, prior): one prune run each, in grid order."""
    groups: dict[str, tuple[Cell, list[Cell]]] = {}
    for cell in missing:
        group = cell.key.rsplit("|", 3)[0] + f"|seed{cell.seed}|{cell.prior}"  # the key without the search
        groups.setdefault(group, (cell, []))[1].append(cell)
    return list(groups.values())


def prune_missing(plan: StudyPlan, missing: list[Cell], done: dict[str, CellResult], save) -> None:
    """Run the missing cells through :func:`pruning.prune.prune`, one shared evaluator per group."""
    from pruning.prune import PruneConfig, prune

    config = plan.config
    for first, cells in _group_missing(missing):
        calibration, drop, seed, prior = first.calibration, first.drop, first.seed, first.prior
        by_search = {cell.search: cell for cell in cells}
        if config.progress:
            print(
                f"study: pruning M={drop} under {calibration.objective} on {calibration.data} (seed {seed}, "
                f"{prior} prior): {', '.join(by_search)}",
                flush=True,
            )

        def record(outcome) -> None:
            cell = by_search[outcome.search]
            done[cell.key] = _cell_result(
                cell,
                outcome.removed_blocks,
                outcome.calibration_loss,
                outcome.dense_loss,
                outcome.search_seconds,
                outcome.block_forwards,
                outcome.subset_evaluations,
                outcome.name,
                outcome.checkpoint,
            )
            save()

        prune(
            PruneConfig(
                model=plan.model,
                calibration=calibration,
                drop=drop,
                searches=tuple(by_search),
                seed=seed,
                random_prior=prior == "random",
                options={s: config.options.get(s, {}) for s in by_search},
                out=config.checkpoints,
                registry_url=config.registry_url,
                dtype=config.dtype,
                device=config.device,
                progress=config.progress,
                timing=config.timing,
                protect=config.protect,
            ),
            on_variant=record,
        )


def _evaluations_from_registry(registry, variant, settings, context: int) -> list:
    """The recorded evaluations of ``variant`` made with these settings (by either engine)."""
    # the recorded window is the requested one capped at the engine's context (vLLM keeps one token spare)
    window_lengths = {min(settings.seq_len, context), min(settings.seq_len, context - 1)}
    found = []
    for evaluation in registry.evaluations(variant):
        recorded = evaluation.settings or {}
        if recorded.get("limit") != settings.limit or recorded.get("dtype") != settings.dtype:
            continue
        if recorded.get("num_fewshot", settings.num_fewshot) != settings.num_fewshot:
            continue
        if "seq_len" in recorded and recorded["seq_len"] not in window_lengths:
            continue
        found.append(evaluation)
    return found


def _as_metrics(results) -> dict[str, float]:
    """``task/metric -> value`` of evaluation results or recorded evaluations."""
    return {f"{result.task}/{result.metric}": result.value for result in results}


def evaluate_all(
    plan: StudyPlan, done: dict[str, CellResult], registry, save, *, include_dense: bool = True
) -> dict[str, float]:
    """Evaluate the dense model (unless ``include_dense`` is False) and every distinct variant of ``done``
    not yet evaluated; return the dense metrics (empty without the dense model).

    Variants with byte-identical weights (the same mask found by several searches or seeds, or under both
    objectives) are evaluated once: the others get a copy of those results in the registry, since the
    evaluation depends on the weights and the settings only."""
    from pruning.evaluation.suites import (
        EvalResult,
        EvalSettings,
        evaluate_model,
        expand_suites,
        prepare_data,
        record_results,
    )
    from pruning.models import load_config

    config = plan.config
    settings = EvalSettings(
        suites=config.suites,
        engine=config.engine,
        dtype=config.dtype,
        seq_len=config.eval_seq_len,
        limit=config.eval_limit,
        progress=config.progress,
    )
    suites = expand_suites(settings.suites, plan.demo_dir is not None)
    expected = _expected_metric_count(suites)
    context = int(getattr(load_config(plan.model), "max_position_embeddings", 2048))
    targets: dict[str, Any] = {"dense": registry.resolve(plan.model)} if include_dense else {}
    for result in done.values():
        if result.variant and result.variant not in targets:
            targets[result.variant] = registry.resolve(result.variant)
    recorded = {
        name: _evaluations_from_registry(registry, info, settings, context) for name, info in targets.items()
    }
    metrics = {name: _as_metrics(evaluations) for name, evaluations in recorded.items()}
    by_weights: dict[str, list] = {}  # weights sha256 -> complete results of a variant with those weights
    for name, info in targets.items():
        sha256 = getattr(info, "checkpoint_sha256", None)
        if sha256 and len(metrics[name]) >= expected:
            by_weights.setdefault(sha256, recorded[name])
    todo = [name for name in targets if len(metrics[name]) < expected]
    if todo:
        prepared = None
        for number, name in enumerate(todo, start=1):
            info = targets[name]
            sha256 = getattr(info, "checkpoint_sha256", None)
            if sha256 in by_weights:
                results = [
                    EvalResult(r.suite, r.task, r.metric, r.value, dict(r.settings or {}))
                    for r in by_weights[sha256]
                ]
                if config.progress:
                    print(
                        f"study: {name} has the weights of a variant already evaluated; results copied",
                        flush=True,
                    )
            else:
                if config.progress:
                    print(f"study: evaluating {name} ({number}/{len(todo)})", flush=True)
                prepared = prepared or prepare_data(suites, plan.demo_dir)
                results = evaluate_model(info.checkpoint_path, suites, prepared, settings)
                if sha256:
                    by_weights[sha256] = results
            record_results(registry, info, results)
            metrics[name] = _as_metrics(results)
            for result in done.values():
                if result.variant == name:
                    result.metrics = metrics[name]
            save(metrics.get("dense", {}))
    for result in done.values():
        result.metrics = metrics.get(result.variant, result.metrics)
    return metrics.get("dense", {})


def _expected_metric_count(suites: list[str]) -> int:
    from pruning.evaluation.suites import PERPLEXITY_TASKS, ZERO_SHOT_TASKS

    count = 0
    if "perplexity" in suites:
        count += len(PERPLEXITY_TASKS)
    if "zero-shot" in suites:
        count += len(ZERO_SHOT_TASKS)  # at least acc per task
    if "demo" in suites:
        count += 3  # demo_text perplexity, demo_qa acc and acc_norm
    if "offline" in suites:
        count += 3  # pydoc perplexity, pydoc_cloze acc and acc_norm
    return count


def run_study(config: StudyConfig) -> Path:
    """Run (or resume) the study and write its report.

    Returns:
        The report directory.
    """
    from pruning.study.report import write_report
    from registry import open_registry

    if config.worker:
        from pruning.study.worker import run_worker

        return run_worker(config)
    plan = plan_study(config)
    registry = open_registry(config.registry_url)
    manifest = load_manifest(config.out)
    done: dict[str, CellResult] = {}
    dense: dict[str, float] = {}
    for cell in plan.cells:
        recorded = manifest.get(cell.key)
        if recorded and recorded.matches(cell) and Path(recorded.checkpoint or "").is_dir():
            done[cell.key] = manifest[cell.key]
        else:
            found = find_in_registry(registry, plan.model, cell)
            if found is not None:
                done[cell.key] = found

    def save(dense_metrics: dict[str, float] | None = None) -> None:
        if dense_metrics is not None:
            dense.update(dense_metrics)
        save_manifest(config.out, plan, done, dense)

    missing = [cell for cell in plan.cells if cell.key not in done]
    if config.progress:
        print(
            f"study: {len(plan.cells)} cells, {len(plan.cells) - len(missing)} already done, "
            f"{len(missing)} to run",
            flush=True,
        )
    save()
    if missing:
        prune_missing(plan, missing, done, save)
    dense.update(evaluate_all(plan, done, registry, save))
    save()
    healing = None
    if config.heal:
        from pruning.study.healing import heal_study

        healing = heal_study(plan, done, registry)
    cells = [done[cell.key] for cell in plan.cells]
    write_report(config.out, plan_summary(plan), cells, dense, healing=healing)
    return config.out


def plan_summary(plan: StudyPlan) -> dict:
    """What the report says about the setup."""
    config = plan.config
    fields = ("objective", "data", "samples", "seq_len", "sampling")
    calibrations = sorted({tuple(getattr(c.calibration, name) for name in fields) for c in plan.cells})
    return {
        "model": plan.model,
        "model_name": Path(str(config.model)).name,  # as the user named it: smollm2-135m, Llama-3.1-8B
        "num_blocks": plan.num_blocks,
        "drops": list(config.drops),
        "objectives": list(config.objectives),
        "searches": list(config.searches),
        "seeds": list(config.seeds),
        "random_prior_control": config.random_prior_control,
        "cross_controls": config.cross_controls,
        "timing": config.timing,
        "protect": list(config.protect),
        "calibrations": [dict(zip(fields, c, strict=True)) for c in calibrations],
        "suites": list(config.suites),
        "engine": config.engine,
        "eval_limit": config.eval_limit,
        "eval_seq_len": config.eval_seq_len,
        "dtype": config.dtype,
        "options": config.options,
        "demo": plan.demo_dir is not None,
    }
