"""The command line keeps its shape: every option of every command, as click sees it, equals the committed
snapshot (tests/data/cli_help_snapshot.json, taken before the options were declared from the config
dataclasses: issue 56 item 1).

Per command (``depthprune variants list``) and parameter: its flags, type, default, whether it is required,
repeatable, a flag or hidden, its metavar, environment variable, bounds and help text. Parameters are keyed
by their flags, so moving an option within its command (docs/commands.md shows the order) is not a change;
renaming, retyping, re-defaulting or re-wording one is. After an intended change, rewrite the snapshot::

    .venv/bin/python -m tests.test_cli_help_snapshot --write
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

SNAPSHOT = Path(__file__).resolve().parent / "data" / "cli_help_snapshot.json"


def _plain(value):
    """A JSON value for a click default: numbers, strings, lists as they are, anything else as its repr."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    if isinstance(value, Path):
        return str(value)
    return repr(value)


def parameter_key(parameter) -> str:
    """An option by its flags (``--json``, ``--option -o``), an argument by its name: the Python parameter
    behind it may be renamed without the command line changing."""
    if parameter.param_type_name == "argument":
        return f"argument {parameter.name}"
    return " ".join(sorted(parameter.opts))


def _type_name(parameter) -> str:
    """The value type typer parses the parameter as: ``int``, ``Path``, ``list[str]``."""
    descriptor = getattr(parameter, "type_descriptor", None)
    annotation = descriptor.annotation if descriptor is not None else parameter.type
    return annotation.__name__ if isinstance(annotation, type) else str(annotation)


def describe_parameter(parameter) -> dict:
    """What the command line shows and accepts of one parameter (a typer option or argument)."""
    entry = {
        "kind": parameter.param_type_name,
        "flags": [*parameter.opts, *parameter.secondary_opts],
        "type": _type_name(parameter),
        "default": _plain(parameter.default),
        "required": parameter.required,
        "multiple": parameter.multiple,
        "nargs": parameter.nargs,
        "metavar": parameter.metavar,
        "envvar": _plain(parameter.envvar),
        "help": getattr(parameter, "help", None),
        "min": getattr(parameter, "min", None),
        "max": getattr(parameter, "max", None),
    }
    if parameter.param_type_name == "option":
        entry.update(
            is_flag=parameter.is_flag,
            count=parameter.count,
            hidden=parameter.hidden,
            show_default=parameter.show_default,
        )
    return entry


def cli_shape() -> dict:
    """``"depthprune PATH..." -> {"help": ..., "params": {name: description}}`` for every command."""
    import typer

    from depthprune.cli.app import build_app

    root = typer.main.get_command(build_app())
    shape = {}

    def walk(command, path: tuple[str, ...]) -> None:
        shape[" ".join(("depthprune", *path))] = {
            "help": command.help,
            "params": {parameter_key(param): describe_parameter(param) for param in command.params},
        }
        if hasattr(command, "list_commands"):  # a group
            context = typer.Context(command, info_name=path[-1] if path else "depthprune")
            for name in command.list_commands(context):
                walk(command.get_command(context, name), (*path, name))

    walk(root, ())
    return shape


def test_the_command_line_matches_its_snapshot():
    """Every command, option and argument is as the snapshot records it (module doc)."""
    expected = json.loads(SNAPSHOT.read_text(encoding="utf-8"))
    live = json.loads(json.dumps(cli_shape()))
    assert sorted(live) == sorted(expected), "commands added or removed: rewrite the snapshot (module doc)"
    for command, recorded in expected.items():
        assert live[command]["help"] == recorded["help"], command
        assert sorted(live[command]["params"]) == sorted(recorded["params"]), command
        for name, parameter in recorded["params"].items():
            assert live[command]["params"][name] == parameter, f"{command}: {name}"


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        raise SystemExit(f"usage: python -m tests.test_cli_help_snapshot --write  (writes {SNAPSHOT})")
    SNAPSHOT.parent.mkdir(exist_ok=True)
    SNAPSHOT.write_text(json.dumps(cli_shape(), indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"wrote {SNAPSHOT}")
