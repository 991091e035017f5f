"""Command-line functions of the pruning side: ``checkpoint``, ``prune``, ``heal``, ``eval``
and ``study`` (``bench-evaluator``: :mod:`pruning.cli.bench`).

Each function's signature names the option groups it takes (:mod:`ground.core.cli_options` expands them
into its command line): the ones every command shares (registry, dtype and device, memory plan, ``--json``)
from :mod:`ground.core.options`, the pruning ones from :mod:`pruning.cli.options`, and the fields of
:class:`~pruning.pipeline.config.PruneConfig` and :class:`~pruning.healing.config.HealConfig` themselves.
Heavy modules (torch, transformers) are imported inside the functions so that ``depthprune --help`` stays
fast.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import Annotated

import typer

from ground.core.cli_options import OptionValues, Override, config_from_options, with_options
from ground.core.options import DeviceOptions, JsonOptions, PlanOptions, RegistryOptions
from pruning.cli.groups import suite_list
from pruning.cli.options import (
    CheckpointOptions,
    CheckpointsOptions,
    EvalOptions,
    EvaluationOptions,
    ItemOptions,
    MemoryBudgetOptions,
    ModelOptions,
    ObjectiveOptions,
    PruneCalibrationOptions,
    PruneSearchOptions,
    RepairOptions,
    SamplingOptions,
    SearchScopeOptions,
    StudyCalibrationOptions,
    StudyGridOptions,
    StudyRunOptions,
)
from pruning.healing.config import HealConfig
from pruning.pipeline.config import PruneConfig

# ------------------------------------------------------------------------------------------- checkpoint


@with_options
def checkpoint(
    model: ModelOptions,
    options: CheckpointOptions,
    output: Annotated[JsonOptions, Override(as_json="Print pruning.json as one JSON line.")],
) -> None:
    """Write a variant of MODEL without the given blocks as an ordinary Hugging Face checkpoint."""
    from dataclasses import asdict

    from pruning.model.blocks import parse_block_list
    from pruning.model.checkpoint import write_pruned_checkpoint

    written = write_pruned_checkpoint(
        model.model,
        parse_block_list(options.remove),
        options.out,
        revision=options.revision,
        dtype=options.dtype,
        overwrite=options.overwrite,
    )
    if output.as_json:
        print(json.dumps(asdict(written)))
    else:
        print(
            f"wrote {written.path}: removed blocks {written.removed_blocks} of {written.base_num_blocks} "
            f"({written.architecture}), weights sha256 {written.weights_sha256[:12]}"
        )


# ------------------------------------------------------------------------------------------------- eval


def _print_evaluation_tables(outcome) -> None:
    """Per model, each task's ``n`` and value with its 95 % interval; after the first model, the paired change
    against it, retention and verdict (:mod:`pruning.evaluation.report`)."""
    from pruning.evaluation.report import quality_lines
    from pruning.evaluation.suites import results_as_json

    print("\n".join(quality_lines(results_as_json(outcome))))


@with_options
def evaluate(
    variants: Annotated[
        list[str],
        typer.Argument(
            help="Variants to evaluate: registry names, aliases, 'dense' (or dense@BASE), "
            "or checkpoint directories."
        ),
    ],
    evaluation: EvaluationOptions,
    options: EvalOptions,
    where: RegistryOptions,
    placement: DeviceOptions,
    plan: PlanOptions,
    output: JsonOptions,
) -> None:
    """Measure perplexity and accuracy of dense and pruned variants, each with n and a 95 % interval, every
    variant paired against the first named on the same items; record them in the registry."""
    from ground.planning.devices import auto_device_dtype
    from pruning.evaluation.suites import EvalSettings, evaluate_variants, results_as_json
    from pruning.runtime.plans import PlanRequest
    from registry import open_registry

    device, dtype = auto_device_dtype(placement.device, placement.dtype, plan.gpus, plan.gpu_memory_gib)
    settings = EvalSettings(
        suites=suite_list(evaluation.suite),
        engine=options.engine,
        dtype=dtype,
        device=device,
        seq_len=evaluation.seq_len,
        limit=evaluation.limit,
        windows=evaluation.windows,
        num_fewshot=options.num_fewshot,
        progress=not output.as_json,
    )
    request = PlanRequest(plan.dry_run, plan.gpus, plan.gpu_memory_gib, output.as_json)
    registry = open_registry(where.registry)
    outcome = evaluate_variants(variants, settings, registry, record=not options.no_record, plan=request)
    if output.as_json:
        print(json.dumps(results_as_json(outcome), indent=2))
    else:
        _print_evaluation_tables(outcome)


# ------------------------------------------------------------------------------------------------ prune


def _print_variant(outcome, as_json: bool) -> None:
    """One line per variant the prune run wrote: JSON, or the mask, losses and cost in words."""
    from dataclasses import asdict

    if as_json:
        print(json.dumps(asdict(outcome)), flush=True)
    else:
        print(
            f"{outcome.search}: removed {outcome.removed_blocks}, calibration loss "
            f"{outcome.calibration_loss:.4f} (dense {outcome.dense_loss:.4f}), "
            f"{outcome.search_seconds:.1f} s, {outcome.subset_evaluations} subsets, "
            f"{outcome.block_forwards} block-forwards; validation loss {outcome.validation_loss:.4f}, "
            f"fit {outcome.fit}{', selected' if outcome.selected else ''} -> {outcome.name} "
            f"({outcome.checkpoint})",
            flush=True,
        )


@with_options
def prune(
    model: ModelOptions,
    objective: ObjectiveOptions,
    calibration: PruneCalibrationOptions,
    sampling: SamplingOptions,
    items: ItemOptions,
    search: PruneSearchOptions,
    scope: SearchScopeOptions,
    run: OptionValues[PruneConfig],
    checkpoints: CheckpointsOptions,
    memory: MemoryBudgetOptions,
    repair: RepairOptions,
    where: RegistryOptions,
    placement: DeviceOptions,
    plan: PlanOptions,
    output: Annotated[JsonOptions, Override(as_json="Print one JSON line per variant.")],
) -> None:
    """Choose M blocks to remove under a calibration configuration, write and register the pruned model.

    Interrupted runs resume: re-run the same command and no subset is scored twice.
    """
    from ground.planning.devices import auto_device_dtype
    from pruning.calibration.config import CalibrationConfig
    from pruning.cli.groups import Placement, SearchRequest, prune_config
    from pruning.cli.repair import patch_request
    from pruning.pipeline.prune import parse_searches
    from pruning.runtime.plans import PlanRequest

    searches = SearchRequest(parse_searches(search.search), search.option, scope.protect, scope.timing)
    device, dtype = auto_device_dtype(placement.device, placement.dtype, plan.gpus, plan.gpu_memory_gib)
    calibration_config = CalibrationConfig(
        objective.objective,
        calibration.data,
        objective.samples,
        calibration.seq_len,
        calibration.data_seed,
        sampling.sampling,
        items.margin_clip,
        calibration.kl_weight,
        items.truncate,
    )
    placed = Placement(checkpoints.out, where.registry, dtype, device)
    config = prune_config(model.model, calibration_config, searches, placed, run, memory.memory_budget_gb)
    request = patch_request(repair.heal, repair.heal_data, config)
    _run_prune(config, PlanRequest(plan.dry_run, plan.gpus, plan.gpu_memory_gib, output.as_json), request)


def _run_prune(config, plan, repair=None) -> None:
    """Plan the run's memory, run every search, print one line per variant; with ``repair`` (``--heal``),
    repair the selected variant, print its line too and what the repair changed about the run's choice (on
    stderr with ``--json``)."""
    from pruning.cli.repair import choice_notes, repair_selected
    from pruning.pipeline.prune import prune as run_prune
    from pruning.runtime.plans import plan_prune_run

    config = plan_prune_run(config, plan)
    # One line per variant once every search has run: each line says whether it is the one selected.
    outcomes = list(run_prune(config))
    for outcome in outcomes:
        _print_variant(outcome, plan.as_json)
    if repair is not None and (healed := repair_selected(outcomes, repair, plan)) is not None:
        _print_healed(healed, plan.as_json)
        parent = next(outcome for outcome in outcomes if outcome.selected)
        for note in choice_notes(parent, healed, config.registry_url):
            print(f"   {note}", file=sys.stderr if plan.as_json else sys.stdout, flush=True)


# ------------------------------------------------------------------------------------------------- heal


def _print_healed(outcome, as_json: bool) -> None:
    """The healed variant as one JSON line, or its losses and name in words."""
    from dataclasses import asdict

    if as_json:
        print(json.dumps(asdict(outcome)), flush=True)
        return
    losses = outcome.losses
    training = (
        f", training loss {losses['train_first']:.4f} -> {losses['train']:.4f}"
        if losses.get("train") is not None
        else ""
    )
    validation = (
        f"; validation loss {outcome.parent_validation_loss:.4f} -> {outcome.validation_loss:.4f} "
        f"(the parent's objective and validation data), fit {outcome.fit}"
        if outcome.validation_loss is not None
        else ""
    )
    print(
        f"healed {outcome.parent} with {outcome.method} "
        f"({outcome.steps} steps, {outcome.wall_seconds:.1f} s): "
        f"held-out loss {losses['heldout_before']:.4f} -> {losses['heldout']:.4f}{training}{validation} "
        f"-> {outcome.name} ({outcome.checkpoint})",
        flush=True,
    )


@with_options
def heal(
    variant: Annotated[str, typer.Argument(help="The pruned variant to heal: registry name, alias or id.")],
    healing: OptionValues[HealConfig],
    checkpoints: CheckpointsOptions,
    where: RegistryOptions,
    placement: DeviceOptions,
    output: JsonOptions,
    plan: PlanOptions,
) -> None:
    """Recover a pruned variant's quality (lora, distill, last-blocks or the training-free patch); register
    the result as its child.

    Every method keeps the variant's shape: adapters are merged, the patch is folded into existing weights.
    Ctrl-C is safe: run the same command again and training resumes to the same weights.
    """
    from ground.planning.devices import auto_device_dtype
    from pruning.healing.heal import heal as run_heal
    from pruning.pipeline.heldout import repaired_quality
    from pruning.runtime.plans import PlanRequest, plan_heal_run

    device, dtype = auto_device_dtype(placement.device, placement.dtype, plan.gpus, plan.gpu_memory_gib)
    config = config_from_options(
        HealConfig,
        healing,
        variant=variant,
        device=device,
        dtype=dtype,
        registry_url=where.registry,
        out=checkpoints.out,
    )
    config = plan_heal_run(config, PlanRequest(plan.dry_run, plan.gpus, plan.gpu_memory_gib, output.as_json))
    _print_healed(run_heal(config, assess_child=repaired_quality), output.as_json)


# ------------------------------------------------------------------------------------------------ study


StudyEvaluation = Annotated[
    EvaluationOptions,
    Override(
        limit={"name": "eval_limit"}, windows={"name": "eval_windows"}, seq_len={"name": "eval_seq_len"}
    ),
]
"""``study --eval-limit``, ``--eval-windows``, ``--eval-seq-len`` (``eval``'s ``--limit`` ...)."""


@with_options
def study(
    model: ModelOptions,
    grid: StudyGridOptions,
    calibration: StudyCalibrationOptions,
    sampling: SamplingOptions,
    items: ItemOptions,
    evaluation: StudyEvaluation,
    run: StudyRunOptions,
    scope: Annotated[SearchScopeOptions, Override(timing={"default": "standalone"})],
    checkpoints: Annotated[CheckpointsOptions, Override(out={"name": "checkpoints"})],
    where: RegistryOptions,
    placement: DeviceOptions,
    plan: PlanOptions,
    output: Annotated[JsonOptions, Override(as_json="Print the study's numbers as JSON at the end.")],
) -> None:
    """Run the depth-pruning study grid (objective x data x budget x search x seed), evaluate every variant,
    and write a report with the study's tables and figures.

    Resumable: cells already in the report's cells.json or in the registry are never recomputed. With
    --worker, start the same command on several machines against one PostgreSQL --registry to share the grid.
    """
    from ground.planning.devices import auto_device_dtype
    from pruning.cli import groups
    from pruning.runtime.plans import PlanRequest
    from pruning.study.plan import study_searches

    search_request = groups.SearchRequest(
        study_searches(grid.searches), run.option, scope.protect, scope.timing
    )
    device, dtype = auto_device_dtype(placement.device, placement.dtype, plan.gpus, plan.gpu_memory_gib)
    config = groups.study_config(
        model.model,
        grid,
        (calibration, sampling, items),
        search_request,
        evaluation,
        groups.Placement(checkpoints.out, where.registry, dtype, device),
        run,
        progress=not output.as_json,
    )
    request = PlanRequest(plan.dry_run, plan.gpus, plan.gpu_memory_gib, output.as_json)
    _run_study(config, request, run.executor, run.ray_address)


def _run_study(config, plan, executor: str, ray_address: str | None) -> None:
    """Plan the study's memory, run it on ``executor`` (local or ray), then print where its report is (or,
    with ``--json``, the report's numbers)."""
    from pruning.runtime.plans import plan_study_run
    from pruning.study.run import run_study

    memory = plan_study_run(config, plan)
    if memory is not None and memory.devices.kind == "cuda":  # each cell spreads over the planned cards
        config = dataclasses.replace(config, gpus=memory.devices.count)
    if executor == "ray":
        from pruning.study.ray_executor import run_on_ray

        report = run_on_ray(config, ray_address, memory.choices.get("gpus_per_cell", 0) if memory else 0)
    elif executor != "local":
        from ground.core.errors import UserError

        raise UserError(f"--executor must be local or ray, got {executor!r}")
    else:
        report = run_study(config)
    if plan.as_json:
        print((report / "study.json").read_text())
    else:
        print(f"report: {report / 'README.md'} (HTML: {report / 'report.html'})")


# ------------------------------------------------------------------------------------------ bench-evaluator
