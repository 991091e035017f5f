"""Command-line options every command shares, declared once as option groups (:mod:`.cli_options`).

A command takes ``registry: RegistryOptions`` or ``output: JsonOptions`` instead of spelling the option and
its help again; one whose ``--json`` says something else changes the help for itself with
``Annotated[JsonOptions, Override(as_json="...")]``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ground.core.cli_options import cli, option_group

SEED_HELP = "Seed of every random choice the command makes."
"""``--seed``'s help (:class:`SeedOptions`, and the configs with a seed option of their own)."""


@option_group
@dataclass(frozen=True)
class RegistryOptions:
    """Which registry to read and write."""

    registry: str | None = field(default=None, metadata=cli("--registry", metavar="URL"))
    """Registry database URL (sqlite:///FILE or postgresql+psycopg://USER@HOST/DB); default:
    $DEPTHPRUNE_REGISTRY_URL, else the SQLite file under $DEPTHPRUNE_HOME."""


@option_group
@dataclass(frozen=True)
class JsonOptions:
    """Machine-readable output."""

    as_json: bool = field(default=False, metadata=cli("--json"))
    """Print machine-readable JSON instead of tables."""


@option_group
@dataclass(frozen=True)
class DeviceOptions:
    """Where a torch computation runs, as typed (``ground.planning.devices.auto_device_dtype`` resolves
    ``auto``)."""

    dtype: str = "auto"
    """torch dtype of the weights: auto (bfloat16 on CUDA, float32 on CPU), float32, bfloat16 or float16."""
    device: str = "auto"
    """torch device: auto (CUDA when present, else CPU), cpu, cuda or cuda:N."""


@option_group
@dataclass(frozen=True)
class PlanOptions:
    """The memory plan of a command that loads a model: print it and stop, or plan for another machine."""

    dry_run: bool = field(default=False, metadata=cli("--dry-run"))
    """Print the memory plan (from config.json only) and exit: 0 when it fits, 3 when it does not."""
    gpus: int | None = field(default=None, metadata=cli(min=1))
    """GPUs to plan for (with --dry-run: a machine you are not on)."""
    gpu_memory_gib: float | None = field(default=None, metadata=cli("--gpu-memory-gib"))
    """Memory per GPU to plan for, GiB (default: the real one, else 80)."""


@option_group
@dataclass(frozen=True)
class SeedOptions:
    """The seed of a command's random choices."""

    seed: int = field(default=0, metadata=cli(help=SEED_HELP))
    """The seed (help: :data:`SEED_HELP`)."""
