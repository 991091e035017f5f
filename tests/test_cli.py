"""The console script: every subcommand is installed and explains itself."""

import pytest

from depthprune.cli import COMMANDS
from depthprune.testing.imports import heavy_modules_loaded


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
    assert heavy_modules_loaded("from depthprune.cli import build_app; build_app()") == []
