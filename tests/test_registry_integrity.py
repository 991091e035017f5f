"""The registry and the files it vouches for, when something on disk goes wrong.

- A SQLite registry with a damaged page is refused when it is opened (``PRAGMA quick_check``): one line
  naming the file, non-zero exit, and not a byte written to it.

Run: ``.venv/bin/python -m pytest tests/test_registry_integrity.py -q -p no:cacheprovider``
"""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import pytest

from depthprune.errors import UserError
from depthprune.testing.cli import run_cli
from depthprune.testing.variants import register_example_base, register_example_variant
from registry import open_registry


def damage_a_table_page(database: Path) -> None:
    """Overwrite the b-tree page of the ``variants`` table with garbage (the header page stays intact)."""
    connection = sqlite3.connect(database)
    page_size = connection.execute("PRAGMA page_size").fetchone()[0]
    root_page = connection.execute("SELECT rootpage FROM sqlite_master WHERE name = 'variants'").fetchone()[0]
    connection.close()
    assert root_page > 1
    with database.open("r+b") as handle:
        handle.seek((root_page - 1) * page_size)
        handle.write(bytes([0x0D]) + b"\xff" * (page_size - 1))


@pytest.fixture
def damaged_registry(tmp_path) -> Path:
    """A SQLite registry with a base model, twenty variants and an alias, whose variants page is damaged."""
    database = tmp_path / "registry.db"
    with open_registry(f"sqlite:///{database}") as registry:
        register_example_base(registry)
        for first in range(20):
            register_example_variant(registry, [first % 5, 5], search=f"greedy-{first}")
    # Closing the last connection checkpoints the WAL into the main file, so the damage is not shadowed.
    assert not Path(f"{database}-wal").exists() or Path(f"{database}-wal").stat().st_size == 0
    damage_a_table_page(database)
    return database


def file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_opening_a_damaged_registry_is_a_one_line_user_error(damaged_registry):
    with pytest.raises(UserError) as error:
        open_registry(f"sqlite:///{damaged_registry}")
    message = str(error.value)
    assert "\n" not in message and str(damaged_registry) in message and "damaged" in message


@pytest.mark.parametrize(
    "command",
    [("variants", "list"), ("variants", "alias", "best", "dense"), ("variants", "rm", "1")],
    ids=["list", "alias", "rm"],
)
def test_cli_refuses_a_damaged_registry_and_writes_nothing(damaged_registry, command):
    before = file_digest(damaged_registry)
    code, out, err = run_cli(*command, "--registry", f"sqlite:///{damaged_registry}")
    assert code != 0
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and str(damaged_registry) in lines[0], err
    assert "Traceback" not in err + out
    assert file_digest(damaged_registry) == before
