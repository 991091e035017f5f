"""Shared settings: where depthprune keeps its data, and which registry it talks to.

Both come from the environment so that every command, the gateway and the tests agree:
``DEPTHPRUNE_HOME`` (default ``~/.depthprune``) holds the demo model cache, checkpoints and the
SQLite registry; ``DEPTHPRUNE_REGISTRY_URL`` overrides the registry (e.g. a PostgreSQL URL).
"""

from __future__ import annotations

import os
from pathlib import Path


def home_dir() -> Path:
    """The data directory, created on first use."""
    path = Path(os.environ.get("DEPTHPRUNE_HOME", Path.home() / ".depthprune")).expanduser()
    path.mkdir(parents=True, exist_ok=True)
    return path


def default_registry_url() -> str:
    """``DEPTHPRUNE_REGISTRY_URL`` when set, else a SQLite file in the data directory."""
    return os.environ.get("DEPTHPRUNE_REGISTRY_URL") or f"sqlite:///{home_dir() / 'registry.db'}"


def variants_dir() -> Path:
    """Where pruned checkpoints go when no ``--out`` is given."""
    path = home_dir() / "variants"
    path.mkdir(parents=True, exist_ok=True)
    return path
