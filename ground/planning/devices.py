"""The devices a plan is made for: the real ones, or a machine described on the command line.

``--device auto`` means CUDA when a GPU is present, else the CPU; ``--dtype auto`` means bfloat16 on CUDA and
float32 on the CPU. Whether CUDA is present is asked of torch when the caller has already imported it, else of
``nvidia-smi``: planning never imports torch, so the gateway can size its engines without it.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass

from ground.core.errors import UserError

GIB = 1024**3
DEFAULT_GPU_MEMORY_GIB = 80.0
"""Memory per GPU assumed by ``--gpus N`` without ``--gpu-memory-gib`` and no GPU to ask."""
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
DTYPE_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}
USABLE_SHARE = 0.95
"""Share of a card's memory a plan fills at most: the allocator's fragmentation needs the rest."""
CUDA_CONTEXT_BYTES = 1 * GIB
"""The CUDA context and kernels of one process, before any tensor."""


@dataclass(frozen=True)
class Devices:
    """What a plan is checked against: ``count`` devices of ``memory_bytes`` each."""

    kind: str
    """``cuda`` or ``cpu`` (host memory)."""
    count: int
    """Devices the model may be spread over (device_map); 1 on the CPU."""
    memory_bytes: int
    """Memory of one device (on the CPU: what is available now)."""
    simulated: bool = False
    """Described by ``--gpus``/``--gpu-memory-gib`` rather than found on this machine."""
    sharers: int = 1
    """Processes sharing each card (``study --workers-per-gpu``); ``memory_bytes`` is then one's share."""

    def __post_init__(self):
        if self.count < 1:
            raise UserError(f"--gpus must be at least 1, got {self.count}")
        if self.memory_bytes <= 0:
            raise UserError(f"--gpu-memory-gib must be positive, got {self.memory_bytes / GIB:g}")

    @property
    def usable_bytes(self) -> int:
        """What one device holds for tensors once the context and fragmentation are set aside."""
        reserve = CUDA_CONTEXT_BYTES if self.kind == "cuda" else 0
        return int(self.memory_bytes * USABLE_SHARE) - reserve

    def describe(self) -> str:
        """``4 x 80 GiB GPU (simulated)`` and the like."""
        what = "GPU" if self.kind == "cuda" else "host memory"
        share = (
            f" (a 1/{self.sharers} share of a {self.memory_bytes * self.sharers / GIB:.0f} GiB card)"
            if self.sharers > 1
            else ""
        )
        return f"{self.count} x {self.memory_bytes / GIB:.0f} GiB {what}{share}" + (
            " (simulated)" if self.simulated else ""
        )

    def shared_by(self, processes: int) -> Devices:
        """These devices as one of ``processes`` processes on each card sees them: its share of the memory
        (each process also pays its own CUDA context, which :attr:`usable_bytes` sets aside)."""
        if processes < 1:
            raise UserError(f"--workers-per-gpu must be at least 1, got {processes}")
        if processes == 1 or self.kind != "cuda":
            return self
        return dataclasses.replace(self, memory_bytes=self.memory_bytes // processes, sharers=processes)


def _visible_indices() -> list[int] | None:
    """Numeric ``CUDA_VISIBLE_DEVICES`` entries; None when unset (all visible)."""
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    return [int(item) for item in value.split(",") if re.fullmatch(r"\s*\d+\s*", item)]


def gpu_memory_bytes() -> list[int]:
    """Total memory of every visible GPU (empty when there is none), without importing torch."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        return [torch.cuda.get_device_properties(i).total_memory for i in range(torch.cuda.device_count())]
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        output = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    sizes = [int(float(line)) * 1024**2 for line in output.split() if line.strip()]  # MiB
    visible = _visible_indices()
    return sizes if visible is None else [sizes[i] for i in visible if i < len(sizes)]


def cpu_model() -> str:
    """The processor's model name (``/proc/cpuinfo``), else what :mod:`platform` knows."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_name(device: str, gpus: int = 1) -> str:
    """What ran a computation on ``device``, for records whose seconds are compared later: the GPU's name
    (``4 x NVIDIA H100 80GB HBM3`` for a model spread over four cards) or the CPU's model and logical cores.
    Seconds measured on different machines are not comparable; block-forwards are."""
    if not device.startswith("cuda"):
        return f"{cpu_model()}, {os.cpu_count()} logical cores"
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return device
    index = int(device.split(":", 1)[1]) if ":" in device else torch.cuda.current_device()
    name = torch.cuda.get_device_name(index)
    return f"{gpus} x {name}" if gpus > 1 else name


def cuda_present() -> bool:
    """True when a CUDA device is visible to this process."""
    return bool(gpu_memory_bytes())


def host_memory_bytes() -> int:
    """Host memory available now."""
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:  # pragma: no cover - psutil comes with the pinned environment
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def resolve_device(device: str) -> str:
    """``auto`` -> ``cuda`` when a GPU is present, else ``cpu``; other names are checked and kept.

    Raises:
        UserError: an unknown device name, or CUDA asked for where there is none.
    """
    device = device.strip().lower()
    if device == "auto":
        return "cuda" if cuda_present() else "cpu"
    if not re.fullmatch(r"cpu|cuda(:\d+)?|mps", device):
        raise UserError(f"unknown device {device!r}; use auto, cpu, cuda or cuda:N")
    return device


def resolve_dtype(dtype: str, device: str) -> str:
    """``auto`` -> ``bfloat16`` on CUDA, ``float32`` elsewhere; aliases (bf16, fp32) spelled out.

    Raises:
        UserError: an unknown dtype.
    """
    dtype = DTYPE_ALIASES.get(dtype.strip().lower(), dtype.strip().lower())
    if dtype == "auto":
        return "bfloat16" if device.startswith("cuda") else "float32"
    if dtype not in DTYPE_BYTES:
        raise UserError(f"unknown dtype {dtype!r}; use auto, float32, bfloat16 or float16")
    return dtype


def plan_devices(
    device: str = "auto", gpus: int | None = None, gpu_memory_gib: float | None = None
) -> Devices:
    """The devices to plan for: as described (``--gpus``, ``--gpu-memory-gib``), else the real ones.

    Args:
        device: the command's ``--device`` (resolved already or ``auto``).
        gpus: GPUs to plan for (simulated unless it matches what is here).
        gpu_memory_gib: memory per GPU to plan for.
    """
    if gpus is not None or gpu_memory_gib is not None:
        real = gpu_memory_bytes()
        memory = gpu_memory_gib * GIB if gpu_memory_gib is not None else (real[0] if real else None)
        memory = memory or DEFAULT_GPU_MEMORY_GIB * GIB
        count = gpus if gpus is not None else max(len(real), 1)
        return Devices("cuda", count, int(memory), simulated=not real or gpu_memory_gib is not None)
    device = resolve_device(device)
    if device.startswith("cuda"):
        real = gpu_memory_bytes()
        if not real:
            raise UserError(f"--device {device} but no CUDA device is visible (plan one with --gpus N)")
        # One card unless --gpus asks for more: a model spread over several is placed by device_map.
        index = int(device.split(":")[1]) if ":" in device else 0
        if index >= len(real):
            raise UserError(f"--device {device} but only {len(real)} GPU(s) are visible")
        return Devices("cuda", 1, real[index])
    return Devices("cpu", 1, host_memory_bytes())


def select_visible_device(device: str) -> None:
    """Make ``cuda:N`` the only card this process shows to CUDA (vLLM takes no device argument).

    ``N`` counts among the cards already visible (``CUDA_VISIBLE_DEVICES=2,3`` and ``cuda:1`` is card 3). It
    must run before CUDA is initialised in this process, which one-engine-per-process guarantees.
    """
    if not device.startswith("cuda:"):
        return
    index = int(device.split(":")[1])
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    cards = [item.strip() for item in visible.split(",")] if visible else None
    if cards is not None and index >= len(cards):
        raise UserError(f"--device {device} but CUDA_VISIBLE_DEVICES={visible} shows {len(cards)} card(s)")
    os.environ["CUDA_VISIBLE_DEVICES"] = cards[index] if cards is not None else str(index)


def auto_device_dtype(
    device: str, dtype: str, gpus: int | None = None, gpu_memory_gib: float | None = None
) -> tuple[str, str]:
    """``--device`` and ``--dtype`` with ``auto`` resolved; planning for GPUs (``--gpus``,
    ``--gpu-memory-gib``) counts as CUDA even on a machine without one."""
    planning_gpus = gpus is not None or gpu_memory_gib is not None
    device = "cuda" if device.strip().lower() == "auto" and planning_gpus else resolve_device(device)
    return device, resolve_dtype(dtype, device)


SMALL_MACHINE_CPUS = 4
"""With at most this many usable CPUs an offline vLLM engine binds its threads to all of them
(:func:`omp_binding`)."""


def omp_binding(environment: dict[str, str], cpu_build: bool, tensor_parallel_size: int) -> str | None:
    """``VLLM_CPU_OMP_THREADS_BIND`` for a one-rank *offline* CPU engine (``eval --engine vllm``) on a small
    machine: every usable CPU; None where vLLM's own ``auto`` stays (the GPU build, several ranks, a large
    machine, or the variable set).

    vLLM's ``auto`` reserves one CPU for the engine's scheduler process and binds the model's threads to the
    rest: on this 2-CPU machine SmolLM2-135M decoded on one core, 86 output tokens/s against 137 with both
    bound (benchmarks/omp_binding.sh). An offline engine is all there is to run, so it takes both. A served
    engine keeps ``auto``: beside it run the gateway, the API server and the load test's client, and with
    both CPUs bound the demo's load-test rounds spread ±8 % around the A/A ratio against ±1.5 % (docs/
    benchmarks.md); set ``VLLM_CPU_OMP_THREADS_BIND`` for ``serve`` to bind them anyway.
    """
    if not cpu_build or tensor_parallel_size != 1 or "VLLM_CPU_OMP_THREADS_BIND" in environment:
        return None
    usable = sorted(os.sched_getaffinity(0))
    if len(usable) > SMALL_MACHINE_CPUS:
        return None
    return ",".join(str(cpu) for cpu in usable)
