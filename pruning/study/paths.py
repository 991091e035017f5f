"""Paths a study records, relative to the depthprune home, so that no committed report names a machine.

A cell's checkpoint directory and the study's model are written relative to the home
(:func:`ground.core.settings.home_dir`, ``$DEPTHPRUNE_HOME``) when they lie inside it
(:func:`recorded_path`) and read back against the home of the machine that reads them
(:func:`resolved_path`); a path outside the home stays absolute, as given. :func:`rehome` is the one-off
rewrite of a study written before this rule, given the home of the machine that ran it::

    rehome(json.loads(Path("study.json").read_text()), "/work/runs/gpuhome")
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Any


def _home(home: str | Path | None) -> Path:
    if home is not None:
        return Path(home)
    from ground.core.settings import home_dir

    return home_dir()


def recorded_path(path: str | Path | None, home: str | Path | None = None) -> str | None:
    """``path`` as a study records it: relative to ``home`` (default: the depthprune home) when inside it.

    Args:
        path: a checkpoint directory or model path (or a model name, kept as given: only an absolute path,
            or a relative one that exists here, is a path).
        home: the depthprune home (tests pass their own).

    Returns:
        The relative path (POSIX separators) inside the home; the absolute path outside it; None for None.
    """
    if path is None:
        return None
    given = Path(path)
    if not given.is_absolute():
        if not given.exists():
            return str(path)
        given = given.absolute()
    base = _home(home)
    for candidate, root in ((given, base), (given.resolve(), base.resolve())):
        if candidate.is_relative_to(root) and candidate != root:
            return candidate.relative_to(root).as_posix()
    return str(given)


def resolved_path(path: str | Path | None, home: str | Path | None = None) -> str | None:
    """A recorded path where this machine finds it: a relative one under ``home``, an absolute one as is.

    Args:
        path: what :func:`recorded_path` wrote (or an absolute path recorded before the rule).
        home: the depthprune home (default: this machine's).

    Returns:
        The absolute path; None for None or an empty path.
    """
    if not path:
        return None
    given = Path(path)
    return str(given if given.is_absolute() else _home(home) / given)


def rehome(record: Any, old_home: str) -> Any:
    """``record`` (a study.json or cells.json payload) with every string that is an absolute path under
    ``old_home`` rewritten relative to it: the one-off rewrite of a study recorded before
    :func:`recorded_path`. Deterministic and idempotent; other strings are kept as they are.

    Args:
        record: the JSON value (dicts, lists, strings, numbers).
        old_home: the depthprune home of the machine that ran the study (``/root/.depthprune``).

    Returns:
        A new value of the same shape.
    """
    root = PurePosixPath(old_home)
    if isinstance(record, dict):
        return {key: rehome(value, old_home) for key, value in record.items()}
    if isinstance(record, list):
        return [rehome(value, old_home) for value in record]
    if isinstance(record, str) and record.startswith("/"):
        path = PurePosixPath(record)
        if path.is_relative_to(root) and path != root:
            return path.relative_to(root).as_posix()
    return record
