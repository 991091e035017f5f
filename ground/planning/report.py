"""Showing a :class:`~ground.planning.plan.MemoryPlan`: a rich table or one JSON object, and the exit
status of ``--dry-run`` (0 when it fits, 3 when it does not)."""

from __future__ import annotations

import json

from ground.core.errors import UserError
from ground.planning.devices import GIB
from ground.planning.plan import HOST, MemoryPlan

EXIT_FITS = 0
EXIT_DOES_NOT_FIT = 3


def _gib(value: int) -> str:
    return f"{value / GIB:,.1f}"


def print_plan(plan: MemoryPlan) -> None:
    """The plan as a table: each step's items, its peak on the fullest device, and the verdict."""
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"{plan.command}: {plan.model}, {plan.dtype}, {plan.parameters / 1e9:.2f} B parameters "
        f"({_gib(plan.weights_bytes)} GiB) on {plan.devices.describe()}"
    )
    for column in ("step", "holds", "GiB", "where", "note"):
        table.add_column(column, justify="right" if column == "GiB" else "left")
    for step in plan.steps:
        for index, item in enumerate(step.items):
            table.add_row(step.name if index == 0 else "", item.name, _gib(item.bytes), item.where, item.note)
        verdict = "fits" if step.device_bytes <= plan.devices.usable_bytes else "DOES NOT FIT"
        table.add_row("", f"[bold]peak per device ({verdict})[/bold]", _gib(step.device_bytes), "", "")
    console = Console()
    console = Console(width=max(console.width, 120))  # a pipe gets 80 columns: too narrow for the table
    console.print(table)
    console.print(
        f"peak {_gib(plan.peak_bytes)} GiB of {_gib(plan.devices.usable_bytes)} GiB usable per device: "
        + ("[green]fits[/green]" if plan.fits else "[red]does not fit[/red]")
    )
    for line in plan.shortfalls:
        console.print(f"[red]too few cards[/red]: {line}")
    for key, value in plan.choices.items():
        if key == "engines":  # serve: one line per engine (replica)
            for engine in value:
                console.print(
                    f"  {engine['variant']} replica {engine['replica']}: gpus {engine['gpus']}, "
                    f"tensor_parallel_size {engine['tensor_parallel_size']}, "
                    f"gpu_memory_utilization {engine['gpu_memory_utilization']}"
                )
        else:
            console.print(f"  {key}: {value}")
    for line in plan.advice:
        console.print(f"advice: {line}")
    for line in plan.notes:
        console.print(f"note: {line}")


def dry_run(plan: MemoryPlan, as_json: bool) -> None:
    """Print ``plan`` and end the command: exit 0 when it fits, 3 when it does not."""
    if as_json:
        print(json.dumps(plan.as_json(), indent=1))
    else:
        print_plan(plan)
    raise SystemExit(EXIT_FITS if plan.fits else EXIT_DOES_NOT_FIT)


def refuse_unless_fits(plan: MemoryPlan) -> MemoryPlan:
    """``plan`` when it fits; a one-line user error with its advice before any weight is loaded otherwise.

    CPU plans never refuse: host memory is shared with everything else on the machine, so a plan there is
    advice, not a promise.
    """
    if not plan.fits and plan.devices.kind == "cuda":
        raise UserError(plan.one_line() + " (see --dry-run)")
    return plan


__all__ = ["EXIT_DOES_NOT_FIT", "EXIT_FITS", "HOST", "dry_run", "print_plan", "refuse_unless_fits"]
