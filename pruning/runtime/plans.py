"""The memory plan of a pruning-side command, made before it loads a weight: ``--dry-run`` and the sizes.

Each heavy command (prune, study, heal, eval) calls one function here right after it has built its config:
with ``--dry-run`` the plan is printed and the command exits (0 fits, 3 does not); otherwise a run on a GPU
that cannot fit is refused with the plan's one-line advice, and the sizes the plan chose (calibration batch,
boundary-cache budget) are put into the config. The planner itself is :mod:`ground.planning`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ground.core.errors import UserError
from ground.core.objectives import get_objective
from ground.planning import (
    CalibrationSizes,
    Devices,
    HealSizes,
    MemoryPlan,
    dry_run,
    plan_devices,
    plan_eval,
    plan_heal,
    plan_prune,
    plan_study,
    read_model_config,
    refuse_unless_fits,
)
from ground.planning.devices import gpu_memory_bytes


@dataclass(frozen=True)
class PlanRequest:
    """The planning options of one command line."""

    dry_run: bool = False
    """Print the plan and exit before loading anything."""
    gpus: int | None = None
    """GPUs to plan for (a machine we are not on, or several cards)."""
    gpu_memory_gib: float | None = None
    """Memory per GPU to plan for."""
    as_json: bool = False
    """Print the plan as one JSON object."""


def model_config(model: str) -> dict:
    """config.json of a hub id or directory; an embedded name or a GGUF file is resolved (converted) first,
    so that its name is never asked of the hub (five network retries offline before the fallback)."""
    from pruning.model.sources import resolve_model

    return read_model_config(resolve_model(model, progress=False).model)


def _needed(device: str, request: PlanRequest) -> bool:
    """Plan for --dry-run, for described GPUs, and before any CUDA run; a CPU run goes ahead unplanned
    (host memory is shared with everything else, so its plan could only advise)."""
    planning_gpus = request.gpus is not None or request.gpu_memory_gib is not None
    return request.dry_run or planning_gpus or device.startswith("cuda")


def _finish(plan: MemoryPlan, request: PlanRequest) -> MemoryPlan:
    """Exit with the plan under ``--dry-run``; refuse a GPU run that cannot fit; else the plan."""
    if request.dry_run:
        dry_run(plan, request.as_json)
    if plan.devices.simulated:
        raise UserError(
            f"planned for {plan.devices.describe()}, which is not this machine: use --gpus and "
            "--gpu-memory-gib with --dry-run, or leave them out to run on the devices here"
        )
    visible = len(gpu_memory_bytes()) if plan.devices.kind == "cuda" else 1
    if plan.devices.count > visible:
        raise UserError(
            f"--gpus {plan.devices.count} but {visible} GPU(s) are visible here: plan it with --dry-run, "
            "or run it on a machine with that many cards"
        )
    return refuse_unless_fits(plan)


def sized_prune_config(config, devices: Devices):
    """``config`` (a PruneConfig) with the plan's sizes for ``devices``: the calibration batch, the boundary
    cache's budget and the cards the model is spread over. The same sizes a real run and a study cell use."""
    sizes = _calibration_sizes(config, config.searches)
    plan = plan_prune(model_config(config.model), config.model, config.dtype, devices, sizes)
    return dataclasses.replace(
        config,
        calibration_batch=plan.choices["calibration_batch"],
        memory_budget_gb=config.memory_budget_gb or plan.choices["memory_budget_gb"],
        gpus=devices.count,
    )


def _calibration_sizes(config, searches: tuple[str, ...], seq_len: int | None = None) -> CalibrationSizes:
    calibration = config.calibration if hasattr(config, "calibration") else None
    return CalibrationSizes(
        samples=calibration.samples if calibration else config.samples,
        seq_len=(calibration.seq_len if calibration else seq_len) or 2048,
        keeps_dense_reference=calibration.needs_reference if calibration else False,
        searches=tuple(searches),
        memory_budget_gb=getattr(config, "memory_budget_gb", None),
        shared_evaluator=getattr(config, "timing", "shared") == "shared",
    )


def plan_prune_run(config, request: PlanRequest):
    """``prune``: the plan of ``config`` (a PruneConfig); returns the config with the plan's sizes."""
    if not _needed(config.device, request):
        return config
    devices = plan_devices(config.device, request.gpus, request.gpu_memory_gib)
    sizes = _calibration_sizes(config, config.searches)
    _finish(plan_prune(model_config(config.model), config.model, config.dtype, devices, sizes), request)
    return config if devices.kind != "cuda" else sized_prune_config(config, devices)


def planned_for_device(config, devices: Devices | None = None, *, sharers: int = 1):
    """``config`` (a PruneConfig) sized by the planner for ``devices`` (default: the real card(s) when it
    runs on CUDA, as one of ``sharers`` processes on each; unchanged on the CPU). Study cells take their
    sizes here, as ``prune`` does."""
    if devices is None:
        if not config.device.startswith("cuda"):
            return config
        devices = plan_devices(config.device, config.gpus if config.gpus > 1 else None).shared_by(sharers)
    return sized_prune_config(config, devices)


def plan_study_run(config, request: PlanRequest) -> MemoryPlan | None:
    """``study``: the plan of its largest cell (every objective; the evaluation; healing), for one worker's
    share of the card under ``--workers-per-gpu``."""
    if not _needed(config.device, request):
        return None
    devices = plan_devices(config.device, request.gpus, request.gpu_memory_gib)
    devices = devices.shared_by(config.workers_per_gpu)
    # The largest cell is one whose objective keeps the dense reference, when the grid has one.
    keeps_reference = any(get_objective(name).needs_reference for name in config.objectives)
    sizes = dataclasses.replace(
        _calibration_sizes(config, config.searches, config.seq_len), keeps_dense_reference=keeps_reference
    )
    heal = HealSizes(method=config.heal.split(":")[0]) if config.heal else None
    engine = "torch" if config.engine in ("torch", "hf") else "vllm"
    plan = plan_study(
        model_config(config.model),
        config.model,
        config.dtype,
        devices,
        sizes,
        engine,
        config.eval_seq_len,
        heal,
    )
    return _finish(plan, request)


def plan_heal_run(config, request: PlanRequest):
    """``heal``: the variant's own config.json (and the dense teacher's for distill), from the registry;
    returns ``config`` (a HealConfig) with the cards the plan spreads the models over."""
    from registry import open_registry

    if not _needed(config.device, request):
        return config
    registry = open_registry(config.registry_url)
    parent = registry.resolve(config.variant)
    if parent.is_dense or not parent.checkpoint_path:
        return config  # heal itself says why it cannot heal this one
    teacher = None
    if config.method in ("distill", "patch"):  # the patch reads the dense model's activations
        base = registry.get_base_model(parent.base_model)
        teacher = model_config(base.path or base.model)
    sizes = HealSizes(
        method=config.method,
        full_finetune=config.full_finetune,
        batch_size=config.batch_size,
        seq_len=config.seq_len,
        lora_rank=config.lora_rank,
        lora_targets=tuple(config.lora_targets),
        last_blocks=config.last_blocks or 0,
        patch_windows=config.patch_samples or 0,
        patch_spans=_patch_spans(parent.removed_blocks) if config.method == "patch" else 0,
        patch_keeps_rows=config.estimator == "cosine",
    )
    devices = plan_devices(config.device, request.gpus, request.gpu_memory_gib)
    plan = plan_heal(model_config(parent.checkpoint_path), teacher, parent.name, config.dtype, devices, sizes)
    _finish(plan, request)
    return dataclasses.replace(config, gpus=devices.count) if devices.kind == "cuda" else config


def _patch_spans(removed_blocks) -> int:
    """Maps the patch estimates: maximal runs of consecutive removed blocks."""
    removed = sorted(removed_blocks)
    return sum(1 for number, index in enumerate(removed) if number == 0 or removed[number - 1] != index - 1)


def eval_model_paths(names, registry) -> list[str]:
    """What each ``eval`` name loads (directory, variant checkpoint, dense model); writes nothing."""
    from pruning.model.sources import model_reference

    paths = []
    for name in names:
        model = model_reference(name, registry)  # dense@MODEL of a model never registered, a directory
        if model is not None:
            paths.append(model)
            continue
        variant = registry.resolve(name)
        paths.append(variant.checkpoint_path or variant.base_model)
    return paths


def plan_eval_run(paths: list[str], settings, request: PlanRequest) -> MemoryPlan | None:
    """``eval``: the largest of the variants' engines (they run one after the other)."""
    if not _needed(settings.device, request):
        return None
    from pruning.runtime.engine_choice import resolve_engine

    engine = resolve_engine(settings.engine)
    devices = plan_devices(settings.device, request.gpus, request.gpu_memory_gib)
    plans = [
        plan_eval(model_config(path), path, settings.dtype, devices, engine, settings.seq_len)
        for path in paths
    ]
    return _finish(max(plans, key=lambda plan: plan.peak_bytes), request)


def eval_gpus(plan: MemoryPlan | None) -> int:
    """Cards one evaluation engine spans under ``plan``: vLLM's tensor-parallel size as the plan chose it
    (the fewest that hold the engine), the torch engine's device_map over every planned card."""
    if plan is None or plan.devices.kind != "cuda":
        return 1
    return int(plan.choices.get("eval_tensor_parallel_size", plan.devices.count))
