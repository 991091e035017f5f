"""The console script: every subcommand is installed and explains itself."""

import subprocess
import sys

import pytest
import typer

from depthprune.cli import COMMANDS, build_app, resolve_command


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_resolves(name):
    command = resolve_command(COMMANDS[name])
    assert callable(command) or isinstance(command, typer.Typer)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_has_help(name, run_cli):
    code, out, _ = run_cli(name, "--help")
    assert code == 0
    assert "Usage" in out and len(out.splitlines()) > 3


def test_top_level_help_lists_every_command(run_cli):
    code, out, _ = run_cli("--help")
    assert code == 0
    for name in COMMANDS:
        assert name in out


def test_console_script_runs_without_loading_torch():
    """`depthprune --help` and the registry/server commands must not pay for importing torch."""
    probe = (
        "import sys; from depthprune.cli import build_app; build_app(); "
        "print(sorted(m for m in ('torch', 'vllm', 'transformers') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_build_app_is_a_typer_app():
    assert isinstance(build_app(), typer.Typer)
