"""The memory plan of one command: each step's peak on the fullest device, the sizes chosen, and advice.

A :class:`MemoryPlan` is made from config.json alone (see :mod:`ground.planning.commands` for one
builder per command) and answers three questions before any weight is loaded: does every step fit the
devices, which chunk sizes should the run use (calibration batch, boundary cache, KL reference, vLLM's
``max_model_len`` and memory shares), and if it does not fit, what to change (one line, e.g. "use --gpus 2
(device_map)"). ``--dry-run`` prints it; real runs refuse with its advice.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from ground.planning.devices import GIB, Devices

DEVICE = "device"
HOST = "host"
MAX_PLANNED_GPUS = 64
"""The most GPUs advice will suggest; beyond that the model is not for this tool."""


@dataclass
class Item:
    """One thing a step holds: weights, activations, a cache."""

    name: str
    """What it is, in words."""
    bytes: int
    """Its size on the fullest device (or in host memory)."""
    where: str = DEVICE
    """``device`` (counts against the device) or ``host`` (spilled to host memory)."""
    note: str = ""
    """How the size was chosen."""


@dataclass
class Step:
    """One phase of a run whose items are alive at the same time."""

    name: str
    """The phase (dense reference pass, CBO gradients, evaluation engine, ...)."""
    items: list[Item]
    """What it holds at its peak."""
    devices: int = 1
    """Devices the step spans (device_map or tensor parallel)."""

    @property
    def device_bytes(self) -> int:
        """Peak bytes on the fullest device."""
        return sum(item.bytes for item in self.items if item.where == DEVICE)


@dataclass
class MemoryPlan:
    """Every step of one command against the devices, with the sizes chosen and the advice."""

    command: str
    """prune, study, heal, eval or serve."""
    model: str
    """The model (or variants) planned."""
    dtype: str
    """Weights dtype planned for."""
    devices: Devices
    """What the plan is checked against."""
    parameters: int
    """Parameters of the model (the largest, for several)."""
    weights_bytes: int
    """Bytes of those parameters in ``dtype``."""
    steps: list[Step]
    """The phases, in run order."""
    choices: dict = field(default_factory=dict)
    """Sizes the run uses (calibration_batch, memory_budget_gb, kl_reference, max_model_len, engines...)."""
    advice: list[str] = field(default_factory=list)
    """What to change when it does not fit (first entry), and notes on choices that were made for it."""
    notes: list[str] = field(default_factory=list)
    """Assumptions of the estimate."""
    shortfalls: list[str] = field(default_factory=list)
    """What the devices lack besides memory (too few cards for the engines' replicas and tensor parallel);
    any makes the plan not fit."""

    @property
    def peak_bytes(self) -> int:
        """The largest step's bytes on its fullest device."""
        return max((step.device_bytes for step in self.steps), default=0)

    @property
    def fits(self) -> bool:
        """Every step fits on the devices, and there are cards enough."""
        return self.peak_bytes <= self.devices.usable_bytes and not self.shortfalls

    def one_line(self) -> str:
        """The verdict in one line: what does not fit and the first advice."""
        if self.shortfalls and self.peak_bytes <= self.devices.usable_bytes:
            verdict = f"{self.command} of {self.model} on {self.devices.describe()}: {self.shortfalls[0]}"
            return verdict + (f": {self.advice[0]}" if self.advice else "")
        worst = max(self.steps, key=lambda step: step.device_bytes)
        verdict = (
            f"{self.command} of {self.model} ({self.dtype}) needs {worst.device_bytes / GIB:.1f} GiB in "
            f"'{worst.name}', {self.devices.describe()} holds {self.devices.usable_bytes / GIB:.1f} GiB"
        )
        return verdict + (f": {self.advice[0]}" if self.advice else "")

    def as_json(self) -> dict:
        """The plan as one JSON object (``weights_bytes``, ``peak_bytes``, ``fits``, ``advice``, steps...)."""
        return {
            "command": self.command,
            "model": self.model,
            "dtype": self.dtype,
            "devices": {
                "kind": self.devices.kind,
                "count": self.devices.count,
                "memory_bytes": self.devices.memory_bytes,
                "usable_bytes": self.devices.usable_bytes,
                "simulated": self.devices.simulated,
                "sharers": self.devices.sharers,
            },
            "parameters": self.parameters,
            "weights_bytes": self.weights_bytes,
            "peak_bytes": self.peak_bytes,
            "fits": self.fits,
            "shortfalls": self.shortfalls,
            "advice": self.advice,
            "choices": self.choices,
            "steps": [
                {
                    "name": step.name,
                    "devices": step.devices,
                    "device_bytes": step.device_bytes,
                    "items": [item.__dict__ for item in step.items],
                }
                for step in self.steps
            ],
            "notes": self.notes,
        }


def with_advice(build: Callable[[Devices], MemoryPlan], devices: Devices, scale_hint: str) -> MemoryPlan:
    """``build(devices)`` with advice on what would make it fit when it does not.

    Args:
        build: makes the plan for given devices (the same command and sizes).
        devices: the devices of the run.
        scale_hint: how more GPUs are used by this command, e.g. ``device_map`` or ``tensor parallel``.
    """
    plan = build(devices)
    if plan.fits:
        return plan
    advice = []
    if devices.sharers > 1:  # several workers on a card: fewer of them first
        card = devices.memory_bytes * devices.sharers
        for sharers in range(devices.sharers - 1, 0, -1):
            if build(replace(devices, memory_bytes=card // sharers, sharers=sharers)).fits:
                advice.append(f"run at most {sharers} worker(s) per card (--workers-per-gpu {sharers})")
                return _advised(plan, advice)
        devices = replace(devices, memory_bytes=card, sharers=1)  # does not fit one per card either
    if devices.kind == "cuda":
        for count in range(devices.count + 1, MAX_PLANNED_GPUS + 1):
            if build(replace(devices, count=count, simulated=True)).fits:
                advice.append(f"use --gpus {count} ({scale_hint})")
                break
        else:
            advice.append(f"does not fit even on {MAX_PLANNED_GPUS} GPUs of this size")
    else:
        advice.append("run it on a GPU machine (plan one with --gpus N --gpu-memory-gib G)")
    return _advised(plan, advice)


def _advised(plan: MemoryPlan, advice: list[str]) -> MemoryPlan:
    if plan.dtype == "float32":
        advice.append("or use --dtype bfloat16 (half the weights and activations)")
    plan.advice = advice + plan.advice
    return plan
