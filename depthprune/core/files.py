"""Files written whole or not at all: the one atomic writer every package uses (memo, leases, exports,
healing state).

A file is written beside its destination under a temporary name and renamed over it, so a reader never
sees half a file; a failure on the way (a full disk, Ctrl-C) removes the temporary file, so nothing
half-written is left either.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from pathlib import Path

__all__ = ["write_atomically", "write_text_atomically"]


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
