"""Sizing the managed vLLM engines of ``serve`` from their config.json before any process starts.

Every engine on a card claims a ``gpu_memory_utilization`` share of the whole card and its KV pool fills that
share; with the model's full context (131k tokens for Llama-3.1) three variants cannot share one card. The
memory plan (:func:`ground.planning.plan_serve`) places the engines on the GPUs, chooses the longest
``--max-model-len`` at which they all fit (unless given) and splits each card's memory between its engines
so that the shares add up below 1. ``--replicas`` starts several engines of a variant, each placed on cards
that hold no other replica of it (``replicas x tensor_parallel`` cards per variant; variants may share cards);
each replica gets its own cards as ``CUDA_VISIBLE_DEVICES`` and its own share. ``serve --dry-run`` prints
that plan; a GPU run applies it and refuses with the plan's advice when the engines do not fit. The CPU build
sizes its KV cache in GiB instead (``--kv-cache-gib``): there the replicas are only started, not placed.
A speculative arm's engine (``--speculative``) holds its draft model too: its weights, activations and KV
cache count in that engine's need.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ground.core.errors import UserError
from ground.planning import dry_run, plan_devices, plan_serve, read_model_config, refuse_unless_fits
from server.settings import EnginePlacement, GatewaySettings


@dataclass(frozen=True)
class SizingRequest:
    """The sizing options of one ``serve`` command line."""

    dry_run: bool = False
    """Print the plan and exit."""
    gpus: int | None = None
    """GPUs to plan for (a machine we are not on)."""
    gpu_memory_gib: float | None = None
    """Memory per GPU to plan for."""
    tensor_parallel: str | None = None
    """``N`` for every variant or ``NAME=N,...`` per variant."""
    replicas: str | None = None
    """Engines per variant: ``N`` for every variant or ``NAME=N,...`` per variant."""
    as_json: bool = False
    """Print the plan as JSON."""


def parse_per_variant(option: str, text: str | None, names: list[str]) -> dict[str, int]:
    """``"2"`` or ``"dense=2,m7=1"`` -> a count per variant name (1 when not named).

    Args:
        option: the option's name for errors (``--tensor-parallel``, ``--replicas``).
        text: its value; None or empty: 1 for every variant.
        names: the variants it may name.
    """
    sizes = dict.fromkeys(names, 1)
    for item in (text or "").split(","):
        if not item.strip():
            continue
        name, _, value = item.rpartition("=")
        if name and name.strip() not in sizes:
            raise UserError(f"{option} names {name.strip()!r}, which is not served here")
        if not value.strip().isdigit() or int(value) < 1:
            raise UserError(f"{option} wants N or NAME=N with N >= 1, got {item.strip()!r}")
        for key in [name.strip()] if name else names:
            sizes[key] = int(value)
    return sizes


def with_replicas(settings: GatewaySettings, text: str | None) -> GatewaySettings:
    """``settings`` with each managed variant's replica count from ``--replicas`` (remote ones keep 1)."""
    managed = [spec.name for spec in settings.backends if spec.managed]
    counts = parse_per_variant("--replicas", text, managed)
    backends = [
        dataclasses.replace(spec, replicas=counts[spec.name]) if spec.managed else spec
        for spec in settings.backends
    ]
    return dataclasses.replace(settings, backends=backends)


def size_engines(settings: GatewaySettings, request: SizingRequest, gpu_build: bool) -> GatewaySettings:
    """``settings`` with each managed engine's share, cards and context chosen by the memory plan.

    Args:
        settings: the gateway's settings (remote backends are not sized: they run elsewhere).
        request: the sizing options.
        gpu_build: the installed vLLM is the GPU build (the CPU build is sized by --kv-cache-gib).
    """
    settings = with_replicas(settings, request.replicas)
    managed = [spec for spec in settings.backends if spec.managed]
    planning = request.dry_run or request.gpus is not None or request.gpu_memory_gib is not None
    if not managed or not (gpu_build or planning):
        return settings
    names = [spec.name for spec in managed]
    tensor_parallel = parse_per_variant("--tensor-parallel", request.tensor_parallel, names)
    engines = []
    for spec in managed:
        config = read_model_config(spec.model_dir)
        draft = read_model_config(spec.speculative.model_dir) if spec.speculative is not None else None
        engines += [(spec.name, config, tensor_parallel[spec.name], draft)] * spec.replicas
    dtype = settings.vllm.dtype if settings.vllm.dtype in ("float32", "bfloat16", "float16") else "bfloat16"
    devices = plan_devices("cuda" if planning else "auto", request.gpus, request.gpu_memory_gib)
    plan = plan_serve(engines, dtype, devices, settings.vllm.max_model_len)
    if request.dry_run:
        dry_run(plan, request.as_json)
    refuse_unless_fits(plan)
    placements: dict[str, list[EnginePlacement]] = {}
    for engine in plan.choices["engines"]:  # in replica order
        share = settings.vllm.gpu_memory_utilization or engine["gpu_memory_utilization"]
        placements.setdefault(engine["variant"], []).append(EnginePlacement(tuple(engine["gpus"]), share))
    backends = [
        dataclasses.replace(
            spec,
            tensor_parallel_size=tensor_parallel[spec.name],
            placements=tuple(placements[spec.name]),
        )
        if spec.name in placements
        else spec
        for spec in settings.backends
    ]
    vllm = dataclasses.replace(settings.vllm, max_model_len=plan.choices["max_model_len"])
    return dataclasses.replace(settings, backends=backends, vllm=vllm)
