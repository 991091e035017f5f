"""One declaration per option (issue 56 item 1): options come from dataclass fields through
:mod:`ground.core.cli_options`, and a PruneConfig is built in one factory.

The counts read the source (nothing is imported for them); the rest checks the module that turns fields into
options: names, help from docstrings, overrides, the values a command receives, and its refusals.
"""

# No ``from __future__ import annotations``: the commands below are defined inside the tests, and their
# annotations name local classes, which only evaluated annotations can reach.
import ast
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import pytest

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("depthprune", "ground", "pruning", "registry", "server", "loadtest")
MOST_OPTION_CALLS = 20
"""At most this many ``typer.Option(`` calls in the product packages (before issue 56: 196)."""


def _sources(*packages: str):
    for package in packages:
        yield from sorted((ROOT / package).rglob("*.py"))


def test_few_typer_option_calls_remain():
    """Options are declared on dataclass fields: ``typer.Option(`` is written in cli_options, not per
    command."""
    counts = {
        str(path.relative_to(ROOT)): path.read_text(encoding="utf-8").count("typer.Option(")
        for path in _sources(*PRODUCT)
    }
    found = {path: count for path, count in counts.items() if count}
    assert sum(found.values()) <= MOST_OPTION_CALLS, found
    assert found.get("ground/core/cli_options.py") == 1, found
    for path in _sources(*PRODUCT):
        text = path.read_text(encoding="utf-8")
        if "from typer" not in text:
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("typer"):
                names = {alias.name for alias in node.names}
                assert not names & {"Option", "OptionInfo"}, f"{path}: imports typer's Option directly"


def test_prune_config_is_built_in_one_factory():
    """Every ``PruneConfig(...)`` of the product and the benchmarks is the one in ``prune_config_from``, and
    nothing else hands the class to a builder (``config_from_options(PruneConfig, ...)``)."""
    calls, handed = [], []
    for path in _sources(*PRODUCT, "benchmarks"):
        text = path.read_text(encoding="utf-8")
        if "PruneConfig" not in text:
            continue
        tree = ast.parse(text)
        factories = [
            node
            for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef) and node.name == "prune_config_from"
        ]
        inside = {id(inner) for factory in factories for inner in ast.walk(factory)}
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
            where = f"{path.relative_to(ROOT)}:{node.lineno}"
            if name == "PruneConfig":
                calls.append((where, id(node) in inside))
            elif any(isinstance(arg, ast.Name) and arg.id == "PruneConfig" for arg in node.args):
                if id(node) not in inside:
                    handed.append(where)
    assert [inside for _, inside in calls] == [True], calls
    assert calls[0][0].startswith("pruning/pipeline/config.py:"), calls
    assert not handed, handed


# ------------------------------------------------------------------------------------------- the module


def _example_groups():
    from ground.core.cli_options import UNSET, cli, option_group

    @option_group
    @dataclass(frozen=True)
    class Output:
        as_json: bool = field(default=False, metadata=cli("--json"))
        """Print JSON."""

    @dataclass
    class Config:
        size: int = field(default=3, metadata=cli(min=1))
        """How many,
        at most."""
        rate: float = field(default=2.0, metadata=cli(type=str, default="2", parse=float, help="Per second."))
        """The rate (not this docstring: the metadata's help wins)."""
        home: Path = field(
            default_factory=lambda: Path("/home"),
            metadata=cli(type=Path | None, default=None, parse=lambda v: UNSET if v is None else v),
        )
        """Where."""
        internal: str = "kept"
        """No metadata: not an option."""

    return Output, Config


def test_fields_become_options_with_their_docstrings_types_and_defaults():
    from ground.core.cli_options import option_specs

    Output, Config = _example_groups()
    (json_option,) = option_specs(Output)
    assert (json_option.name, json_option.settings.flags) == ("as_json", ("--json",))
    assert json_option.help == "Print JSON."
    size, rate, home = option_specs(Config)
    assert (size.name, size.type, size.default, size.settings.min) == ("size", int, 3, 1)
    assert size.help == "How many, at most."
    assert (rate.type, rate.default, rate.help) == (str, "2", "Per second.")
    assert home.default is None


def _invoke(command, *args):
    import typer
    from typer.testing import CliRunner

    app = typer.Typer()
    app.command()(command)
    return CliRunner().invoke(app, list(args))


def test_a_command_receives_its_groups_built():
    """An option group or config annotation: the function gets the instance; an Override changes one help."""
    import typer

    from ground.core.cli_options import Override, with_options

    Output, Config = _example_groups()
    seen = {}

    @with_options
    def command(
        name: Annotated[str, typer.Argument()],
        config: Config,
        output: Annotated[Output, Override(as_json="Print one line.")],
    ) -> None:
        """Example."""
        seen.update(name=name, config=config, output=output)

    result = _invoke(command, "x", "--size", "5", "--rate", "4", "--json")
    assert result.exit_code == 0, result.output
    assert seen["name"] == "x" and seen["output"].as_json is True
    assert (seen["config"].size, seen["config"].rate, seen["config"].home) == (5, 4.0, Path("/home"))
    assert "Print one line." in _invoke(command, "--help").output
    assert _invoke(command, "x", "--size", "0").exit_code == 2  # min=1


def test_option_values_let_the_command_add_fields():
    """``OptionValues[Config]``: the typed values by field name; config_from_options adds the command's
    own."""
    from ground.core.cli_options import OptionValues, config_from_options, with_options

    _, Config = _example_groups()
    seen = {}

    @with_options
    def command(raw: OptionValues[Config]) -> None:
        """Example."""
        seen["config"] = config_from_options(Config, raw, internal="set")

    assert _invoke(command, "--home", "/elsewhere").exit_code == 0
    config = seen["config"]
    assert (config.size, config.rate, config.home, config.internal) == (3, 2.0, Path("/elsewhere"), "set")


def test_mistakes_are_refused_where_the_command_is_defined():
    """The same option twice, an override of a parse or of no option, an option without a help text."""
    from ground.core.cli_options import OptionValues, Override, cli, option_specs, with_options

    _, Config = _example_groups()

    def twice(config: Config, raw: OptionValues[Config]) -> None:
        """Example."""

    def unknown(config: Annotated[Config, Override(nothing="help")]) -> None:
        """Example."""

    with pytest.raises(TypeError, match="declared twice"):
        with_options(twice)
    with pytest.raises(TypeError, match="no option nothing"):
        with_options(unknown)
    with pytest.raises(TypeError, match="cannot change parse"):
        Override(size={"parse": int})

    @dataclass
    class NoHelp:
        size: int = field(default=1, metadata=cli())

    with pytest.raises(TypeError, match="docstring"):
        option_specs(NoHelp)
