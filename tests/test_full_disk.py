"""A full disk while a checkpoint is written (``checkpoint``, ``prune``, ``heal``): one line, nothing left.

The write is made to fail where it fails for real: inside ``save_pretrained``, after part of the weights went
to disk, with the error safetensors' writer raises (:class:`safetensors.SafetensorError`, os error 28). Where
the test process may mount a small tmpfs (root on Linux), the same is checked on a really full file system.

Run: ``.venv/bin/python -m pytest tests/test_full_disk.py -q -p no:cacheprovider``
"""

from __future__ import annotations

import errno
import random
import subprocess
from pathlib import Path

import pytest

from depthprune.testing.data import random_texts, write_jsonl
from ground.core.errors import UserError
from pruning.model.disk_space import full_disk_as_user_error, human_bytes, is_disk_full

FULL = "Error while serializing: I/O error: No space left on device (os error 28)"


def fail_saves_as_a_full_disk(monkeypatch) -> None:
    """From now on every ``save_pretrained`` of a model writes part of a weights file, then fails as on a full
    disk."""
    from safetensors import SafetensorError
    from transformers import PreTrainedModel

    def save_pretrained(self, directory, *args, **kwargs):
        Path(directory).mkdir(parents=True, exist_ok=True)
        (Path(directory) / "model.safetensors").write_bytes(b"\0" * 4096)
        raise SafetensorError(FULL)

    monkeypatch.setattr(PreTrainedModel, "save_pretrained", save_pretrained)


@pytest.fixture
def full_disk_at_save(monkeypatch, tiny_model_dirs):
    """Every ``save_pretrained`` in the test fails as on a full disk (:func:`fail_saves_as_a_full_disk`),
    once the tiny llama the tests prune is on disk."""
    tiny_model_dirs("llama")
    fail_saves_as_a_full_disk(monkeypatch)


def leftovers(directory: Path) -> list[str]:
    """What the writer left in ``directory`` (a staging directory would start with a dot)."""
    return sorted(path.name for path in directory.iterdir()) if directory.exists() else []


def without_progress_bars(error: str) -> list[str]:
    """Lines of stderr, without the progress bars transformers draws while it loads and writes."""
    return [line for line in error.replace("\r", "\n").splitlines() if line.strip() and "%|" not in line]


def assert_one_line_naming(error: str, path: Path) -> None:
    lines = without_progress_bars(error)
    assert len(lines) == 1 and lines[0].startswith("error: no space left"), error
    assert str(path) in lines[0] and "it needs about" in lines[0] and " free" in lines[0], error


def test_is_disk_full_reads_errno_messages_and_causes():
    assert is_disk_full(OSError(errno.ENOSPC, "No space left on device"))
    assert is_disk_full(OSError(errno.EDQUOT, "Disk quota exceeded"))
    assert is_disk_full(RuntimeError(FULL))
    assert is_disk_full(Exception("(sqlite3.OperationalError) database or disk is full"))
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as inner:
            raise RuntimeError("could not save") from inner
    except RuntimeError as outer:
        assert is_disk_full(outer)
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError:
            raise UserError("no space left on the device of /x to write the checkpoint") from None
    except UserError as worded:
        assert not is_disk_full(worded)  # already one line: an outer writer leaves it as it is
    assert not is_disk_full(OSError(errno.EACCES, "Permission denied"))
    assert not is_disk_full(ValueError("bad dtype"))
    assert human_bytes(512) == "512 B" and human_bytes(3 * 2**30) == "3.0 GB"


def test_only_a_full_disk_becomes_a_user_error(tmp_path):
    with pytest.raises(
        UserError, match=r"device of .*x to write the checkpoint: it needs about 2\.0 KB, .* free"
    ):
        with full_disk_as_user_error(tmp_path / "x", needed_bytes=lambda: 2048):
            raise OSError(errno.ENOSPC, "No space left on device")
    with pytest.raises(PermissionError), full_disk_as_user_error(tmp_path / "x"):
        raise PermissionError(errno.EACCES, "Permission denied")


def test_checkpoint_on_a_full_disk_is_one_line_and_leaves_nothing(
    tiny_model_dirs, tmp_path, run_cli, full_disk_at_save
):
    out = tmp_path / "variants" / "v"
    code, _, error = run_cli(
        "checkpoint", "--model", tiny_model_dirs("llama"), "--remove", "1,3", "--out", out
    )
    assert code == 2
    assert_one_line_naming(error, out)
    assert leftovers(out.parent) == []


def test_an_existing_checkpoint_survives_a_full_disk_on_overwrite(
    tiny_model_dirs, tmp_path, run_cli, monkeypatch
):
    model, out = tiny_model_dirs("llama"), tmp_path / "v"
    assert run_cli("checkpoint", "--model", model, "--remove", "1", "--out", out)[0] == 0
    before = sorted((path.name, path.stat().st_size) for path in out.iterdir())
    fail_saves_as_a_full_disk(monkeypatch)
    code, _, error = run_cli("checkpoint", "--model", model, "--remove", "2", "--out", out, "--overwrite")
    assert code == 2
    assert_one_line_naming(error, out)
    assert sorted((path.name, path.stat().st_size) for path in out.iterdir()) == before
    assert leftovers(tmp_path) == ["v"]


def test_prune_on_a_full_disk_is_one_line_and_leaves_nothing(
    tiny_model_dirs, tmp_path, run_cli, full_disk_at_save
):
    text = write_jsonl(tmp_path / "text.jsonl", random_texts(random.Random(0), rows=4, words=40))
    out = tmp_path / "variants"
    code, _, error = run_cli(
        "prune",
        "--model",
        tiny_model_dirs("llama"),
        "--objective",
        "perplexity",
        "--data",
        f"text:{text}",
        "--samples",
        "2",
        "--seq-len",
        "16",
        "--drop",
        "1",
        "--search",
        "one_shot",
        "--out",
        out,
        "--registry",
        f"sqlite:///{tmp_path / 'registry.db'}",
    )
    assert code == 2
    lines = without_progress_bars(error)
    assert len(lines) == 1 and lines[0].startswith("error: no space left") and str(out) in lines[0], error
    assert "it needs about" in lines[0]
    assert all(leftovers(directory) == [] for directory in out.rglob("*") if directory.is_dir())


def test_heal_writer_on_a_full_disk_leaves_nothing(tiny_model_dirs, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pruning.healing.merge import write_healed_checkpoint
    from pruning.model.checkpoint import PrunedCheckpoint, write_pruned_checkpoint

    parent = tmp_path / "parent"
    calibration = {"objective": "perplexity"}
    record = write_pruned_checkpoint(
        str(tiny_model_dirs("llama")), [1], parent, calibration=calibration
    ).variant
    model, tokenizer = AutoModelForCausalLM.from_pretrained(parent), AutoTokenizer.from_pretrained(parent)
    fail_saves_as_a_full_disk(monkeypatch)
    out = tmp_path / "healed"
    with pytest.raises(UserError, match="no space left on the device of .*healed") as raised:
        write_healed_checkpoint(model, tokenizer, parent, out, record)
    assert len(str(raised.value).splitlines()) == 1 and "it needs about" in str(raised.value)
    assert not out.exists() and leftovers(tmp_path) == ["parent"]
    assert PrunedCheckpoint.read(parent).removed_blocks == [1]


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 256 KB tmpfs, where the test may mount one (root on Linux); skipped elsewhere."""
    mount_point = tmp_path / "tmpfs"
    mount_point.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount_point)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=True)


def test_checkpoint_on_a_really_full_tmpfs(tiny_model_dirs, small_tmpfs, run_cli):
    out = small_tmpfs / "v"
    code, _, error = run_cli(
        "checkpoint", "--model", tiny_model_dirs("llama"), "--remove", "1,3", "--out", out
    )
    assert code == 2
    assert_one_line_naming(error, small_tmpfs)
    assert leftovers(small_tmpfs) == []
