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

DtypeOption = Annotated[str, typer.Option(help="torch dtype of the weights: float32, bfloat16 or float16.")]
"""Weights dtype of a torch computation."""

DeviceOption = Annotated[str, typer.Option(help="torch device, e.g. cpu or cuda.")]
"""torch device of a computation."""

SeedOption = Annotated[int, typer.Option(help="Seed of every random choice the command makes.")]
"""Seed."""
