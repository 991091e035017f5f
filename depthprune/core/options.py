"""Command-line options every command shares, written once (``Annotated`` types for typer signatures).

A command takes ``registry: RegistryOption = None`` or ``as_json: JsonOption = False`` instead of spelling the
option and its help again; a command that needs a different help text for the same flag keeps its own.
"""

from __future__ import annotations

from typing import Annotated

import typer

RegistryOption = Annotated[
    str | None,
    typer.Option(
        "--registry",
        metavar="URL",
        help="Registry database URL (sqlite:///FILE or postgresql+psycopg://USER@HOST/DB); "
        "default: $DEPTHPRUNE_REGISTRY_URL, else the SQLite file under $DEPTHPRUNE_HOME.",
    ),
]
"""Which registry to read and write."""

JsonOption = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON instead of tables.")]
"""Machine-readable output."""

DtypeOption = Annotated[
    str,
    typer.Option(
        help="torch dtype of the weights: auto (bfloat16 on CUDA, float32 on CPU), float32, bfloat16 "
        "or float16."
    ),
]
"""Weights dtype of a torch computation."""

DeviceOption = Annotated[
    str, typer.Option(help="torch device: auto (CUDA when present, else CPU), cpu, cuda or cuda:N.")
]
"""torch device of a computation."""

DryRunOption = Annotated[
    bool,
    typer.Option(
        "--dry-run",
        help="Print the memory plan (from config.json only) and exit: 0 when it fits, 3 when it does not.",
    ),
]
"""Plan memory and exit before loading any weight."""

GpusOption = Annotated[
    int | None, typer.Option(help="GPUs to plan for (with --dry-run: a machine you are not on).", min=1)
]
"""Number of GPUs the memory plan is made for."""

GpuMemoryOption = Annotated[
    float | None,
    typer.Option(
        "--gpu-memory-gib", help="Memory per GPU to plan for, GiB (default: the real one, else 80)."
    ),
]
"""Memory per GPU the memory plan is made for."""

SeedOption = Annotated[int, typer.Option(help="Seed of every random choice the command makes.")]
"""Seed."""
