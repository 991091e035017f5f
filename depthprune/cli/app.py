"""The ``depthprune`` console script: one command, subcommands that are plain typed functions.

Each subcommand lives next to the code it drives (``pruning.cli.commands``, ``registry.cli``, ``server.cli``,
``loadtest.cli``); this module only assembles them. Those modules import their heavy engines (torch,
vLLM) inside the functions, so ``depthprune --help`` and the registry commands stay fast.

Run ``depthprune --help`` or ``depthprune COMMAND --help``.
"""

from __future__ import annotations

import signal
import sys
import threading
from typing import Any, Protocol, runtime_checkable

import typer

from ground.core.errors import UserError
from ground.core.registry_table import NamedTable


@runtime_checkable
class Command(Protocol):
    """A subcommand: a plain function whose typed signature is its command line, or a ``typer.Typer`` (a
    command group)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the command (typer calls it with the parsed options)."""


COMMANDS: NamedTable[Command] = NamedTable(
    "command",
    {
        "demo-model": "depthprune.cli.demo_model:demo_model",
        "checkpoint": "pruning.cli.commands:checkpoint",
        "prune": "pruning.cli.commands:prune",
        "heal": "pruning.cli.commands:heal",
        "bench-evaluator": "pruning.cli.bench:bench_evaluator",
        "eval": "pruning.cli.commands:evaluate",
        "study": "pruning.cli.commands:study",
        "data": "pruning.cli.data:app",
        "variants": "registry.cli:app",
        "serve": "server.cli:serve",
        "experiments": "server.experiments_cli:app",
        "loadtest": "loadtest.cli:loadtest",
        "demo": "depthprune.cli.demo:demo",
    },
    interface=Command,
)
"""name -> the command, imported when the application is built; one that is a ``typer.Typer`` becomes a
command group. ``depthprune --help`` lists them in this order."""


def build_app() -> typer.Typer:
    """The typer application with every subcommand that is installed."""
    app = typer.Typer(
        name="depthprune",
        help="Prune whole Transformer blocks under a calibration configuration; register and serve variants.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
    )
    for name in COMMANDS:
        try:
            command = COMMANDS[name]
        except (ModuleNotFoundError, AttributeError):
            # Installed without that part (tests/test_cli.py checks a full install has every command).
            continue
        if isinstance(command, typer.Typer):
            app.add_typer(command, name=name)
        else:
            app.command(name)(command)
    return app


class UnwindOnSigterm:
    """While active (in the main thread), SIGTERM raises :class:`KeyboardInterrupt` where the command is, so
    that it unwinds as after Ctrl-C, and :attr:`received` says it came. Python's default ends the process on
    the spot, which left the demo's gateway and engines running and an in-process vLLM engine's worker
    orphaned; unwinding runs the ``finally`` blocks that stop them. A command that installs its own handler
    (serve's uvicorn) keeps it while it runs."""

    def __init__(self) -> None:
        self.received = False
        self._previous = None

    def _handle(self, _signal_number, _frame) -> None:
        self.received = True
        raise KeyboardInterrupt

    def __enter__(self) -> UnwindOnSigterm:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._handle)
        return self

    def __exit__(self, *exc_info) -> None:
        if self._previous is not None:  # run in-process (tests): the caller's handler as it was
            signal.signal(signal.SIGTERM, self._previous)


def main(argv: list[str] | None = None) -> None:
    """Entry point of the console script; user mistakes exit 2 with one line on stderr; SIGTERM exits 143
    once the command has unwound (Ctrl-C: 130, as typer ends it)."""
    with UnwindOnSigterm() as sigterm:
        try:
            build_app()(args=argv, prog_name="depthprune")
        except UserError as error:
            print(f"error: {error}", file=sys.stderr)
            raise SystemExit(2) from None
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            raise SystemExit(130) from None
        except SystemExit:
            if not sigterm.received:
                raise
            print("terminated", file=sys.stderr)
            raise SystemExit(128 + signal.SIGTERM) from None


if __name__ == "__main__":
    main()
