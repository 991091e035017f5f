"""Files written whole or not at all: the one atomic writer every package uses (memo, leases, exports,
healing state); and the one exclusive file lock (a cache entry built once, a report written by one worker at
a time).

A file is written beside its destination under a temporary name and renamed over it, so a reader never
sees half a file; a failure on the way (a full disk, Ctrl-C) removes the temporary file, so nothing
half-written is left either.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

__all__ = ["exclusive_lock", "lock_beside", "write_atomically", "write_text_atomically"]


def write_atomically(path: str | Path, write: Callable[[Path], None]) -> None:
    """Produce ``path`` by ``write(temporary)`` and a rename; on any failure, no file is left behind.

    Args:
        path: the destination; its directory is created when missing.
        write: writes the whole content to the path it is given (``torch.save``, ``Path.write_text``, ...).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Unique per writer, so two processes saving the same file never write into one temporary file.
    temporary = path.with_name(f".{path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp")
    try:
        write(temporary)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def write_text_atomically(path: str | Path, text: str) -> None:
    """:func:`write_atomically` of ``text`` (UTF-8, newlines as given)."""
    write_atomically(path, lambda temporary: temporary.write_text(text, encoding="utf-8", newline=""))


@contextlib.contextmanager
def exclusive_lock(lock_path: str | Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``lock_path`` (created, with its directory) for the ``with`` block.

    Processes on one machine that take the same lock run the block one after another; the lock goes with
    the process, so a killed holder never leaves it taken.
    """
    lock_path = Path(lock_path)
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def lock_beside(target: Path) -> Path:
    """The lock file of a directory or file being built: ``.NAME.lock`` next to it."""
    return target.parent / f".{target.name}.lock"
