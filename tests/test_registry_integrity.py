"""The registry and the files it vouches for, when something on disk goes wrong.

- A SQLite registry with a damaged page is refused when it is opened (``PRAGMA quick_check``): one line
  naming the file, non-zero exit, and not a byte written to it.
- Registration hashes every file that defines a model (weights, config, tokenizer, generation config, chat
  template), for a variant's checkpoint and a base model's directory; a change to any of them is refused
  before serving, naming the file.

Run: ``.venv/bin/python -m pytest tests/test_registry_integrity.py -q -p no:cacheprovider``
"""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import pytest

from depthprune.testing.cli import run_cli
from depthprune.testing.variants import EXAMPLE_BASE, register_example_base, register_example_variant
from ground.core.errors import UserError
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


MODEL_FILES = {
    "model.safetensors": b"weights",
    "config.json": b'{"num_hidden_layers": 4}',
    "generation_config.json": b'{"temperature": 0.7}',
    "tokenizer.json": b'{"model": {}}',
    "tokenizer_config.json": b"{}",
    "special_tokens_map.json": b"{}",
    "tokenizer.model": b"sentencepiece",
    "chat_template.jinja": b"{{ messages }}",
    "pruning.json": b"{}",
}
NOT_MODEL_FILES = {"README.md": b"# card", "notes.txt": b"scratch"}


def model_directory(directory: Path) -> Path:
    """A directory holding every kind of file that defines a model, and two that do not."""
    directory.mkdir(parents=True)
    for name, content in {**MODEL_FILES, **NOT_MODEL_FILES}.items():
        (directory / name).write_bytes(content)
    return directory


@pytest.fixture
def registered(tmp_path):
    """``(registry URL, variant checkpoint, base model directory)`` with both registered."""
    from ground.core.checksums import weights_sha256

    url = f"sqlite:///{tmp_path / 'registry.db'}"
    checkpoint, base = model_directory(tmp_path / "variant"), model_directory(tmp_path / "base")
    with open_registry(url) as registry:
        register_example_base(registry, EXAMPLE_BASE, weights_sha256=weights_sha256(base), path=str(base))
        register_example_variant(registry, [1, 3], checkpoint=checkpoint, name="pruned")
    return url, checkpoint, base


def test_registration_hashes_every_file_that_defines_the_model(registered):
    url, checkpoint, base = registered
    with open_registry(url) as registry:
        variant, dense = registry.resolve("pruned"), registry.resolve("dense")
        base_info = registry.get_base_model(EXAMPLE_BASE)
    expected = {name: hashlib.sha256(content).hexdigest() for name, content in MODEL_FILES.items()}
    assert variant.checkpoint_files == expected
    assert dense.checkpoint_files == expected and base_info.model_files == expected


@pytest.mark.parametrize("which", ["pruned", "dense"])
@pytest.mark.parametrize(
    "tamper",
    [
        ("config.json", lambda path: path.write_text('{"num_hidden_layers": 2}'), "changed"),
        ("tokenizer.json", lambda path: path.write_text('{"model": {"vocab": {}}}'), "changed"),
        ("chat_template.jinja", lambda path: path.write_text("{{ evil }}"), "changed"),
        ("generation_config.json", lambda path: path.unlink(), "missing"),
        ("model.safetensors", lambda path: path.write_bytes(b"other weights"), "changed"),
        ("model-extra.safetensors", lambda path: path.write_bytes(b"more weights"), "added"),
    ],
    ids=["config", "tokenizer", "chat-template", "generation-config-removed", "weights", "weights-added"],
)
def test_a_changed_model_file_is_refused_naming_it(registered, which, tamper):
    url, checkpoint, base = registered
    name, change, how = tamper
    directory = checkpoint if which == "pruned" else base
    change(directory / name)
    (directory / "README.md").write_text("edited card: not part of the model")
    with open_registry(url) as registry:
        with pytest.raises(UserError) as error:
            registry.verify_checkpoint(which)
    message = str(error.value)
    assert f"{how} {name}" in message and str(directory) in message and "\n" not in message


def test_files_that_do_not_define_the_model_may_change(registered):
    url, checkpoint, base = registered
    for directory in (checkpoint, base):
        (directory / "README.md").write_text("a new model card")
        (directory / "notes.txt").unlink()
    with open_registry(url) as registry:
        registry.verify_checkpoint("pruned")
        registry.verify_checkpoint("dense")
