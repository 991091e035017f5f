"""A full disk as one line: which path could not be written, how much it needs and how much is free.

Writing a checkpoint (``checkpoint``, ``prune``, ``heal``) on a full disk fails deep inside safetensors,
transformers or the tokenizer with a long traceback. :func:`full_disk_as_user_error` turns every such failure
into a :class:`~ground.core.errors.UserError`, which the command line prints as one ``error:`` line::

    with full_disk_as_user_error(out, needed_bytes=lambda: checkpoint_bytes(model, source_dir)):
        with staged_directory(out) as staging:
            ...

The writers build their directory under a temporary name and remove it when the write fails, so nothing
half-written is left: the context manager goes *outside* the staging, so that the space is given back before
the free space is measured and reported.
"""

from __future__ import annotations

import errno
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from ground.core.errors import UserError

__all__ = ["checkpoint_bytes", "free_bytes", "full_disk_as_user_error", "human_bytes", "is_disk_full"]

FULL_DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
"""``errno`` values of a write refused for lack of space (no space left, disk quota exceeded)."""

FULL_DISK_MESSAGES = (
    "no space left on device",  # strerror(ENOSPC), also in safetensors' "(os error 28)" messages
    "os error 28",
    "disk quota exceeded",
    "os error 122",
    "database or disk is full",  # SQLite
)
"""How libraries that do not raise :class:`OSError` (safetensors' Rust writer, SQLite) word it."""

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
"""Files of a model directory that a checkpoint writer rewrites from the tensors rather than copies."""


def is_disk_full(error: BaseException) -> bool:
    """Whether ``error``, or an exception it was raised from or during, says the device is full.

    A :class:`UserError` never is: it already says what to do (an inner writer's full-disk line included).
    """
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen and not isinstance(current, UserError):
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in FULL_DISK_ERRNOS:
            return True
        text = str(current).lower()
        if any(message in text for message in FULL_DISK_MESSAGES):
            return True
        hidden = current.__suppress_context__  # `raise ... from None`
        current = current.__cause__ if current.__cause__ is not None or hidden else current.__context__
    return False


def free_bytes(path: str | Path) -> int:
    """Bytes free to this user on the file system that holds ``path`` (or its nearest existing parent)."""
    existing = Path(path).expanduser().absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    return shutil.disk_usage(existing).free


def human_bytes(count: float) -> str:
    """``1.5 GB``-style size (powers of 1024, as ``df -h``)."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(count) < 1024 or unit == "TB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    raise AssertionError("unreachable")


def checkpoint_bytes(model, source_dir: str | Path | None = None) -> int:
    """About how many bytes a ``save_pretrained`` of ``model`` takes, plus the tokenizer and config files.

    Args:
        model: a torch module; tied tensors (one storage) count once, as safetensors stores them once.
        source_dir: the directory the tokenizer and configuration are copied from; its files that are not
            weights are added.

    Returns:
        The estimate in bytes (a little below the real size: file headers are not counted).
    """
    storages: dict[int, int] = {}
    for tensor in model.state_dict().values():
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = max(storages.get(storage.data_ptr(), 0), storage.nbytes())
    total = sum(storages.values())
    if source_dir is not None and Path(source_dir).is_dir():
        for path in Path(source_dir).iterdir():
            if path.is_file() and not path.name.endswith(WEIGHT_SUFFIXES):
                total += path.stat().st_size
    return total


@contextmanager
def full_disk_as_user_error(
    path: str | Path, *, needed_bytes: Callable[[], int] | int | None = None, what: str = "checkpoint"
) -> Iterator[None]:
    """Turn a failure for lack of space inside the block into a one-line :class:`UserError`.

    Args:
        path: what the block writes (named in the message unless the failing call names its own file).
        needed_bytes: how much the write needs, or a function computing it when the disk is full.
        what: what is being written, in words.

    Raises:
        UserError: ``no space left on the device of PATH to write the WHAT: it needs about X, Y free ...``.
    """
    try:
        yield
    except Exception as error:
        if not is_disk_full(error):
            raise
        failed = getattr(error, "filename", None) or path
        try:
            needed = needed_bytes() if callable(needed_bytes) else needed_bytes
        except Exception:  # an estimate that fails must not hide the full disk
            needed = None
        need = f"it needs about {human_bytes(needed)}, " if needed else ""
        raise UserError(
            f"no space left on the device of {failed} to write the {what}: {need}"
            f"{human_bytes(free_bytes(failed))} free; free some space or write elsewhere"
        ) from None
