"""Content hashes that tie a registry row to the weights it describes (torch-free, used by every package)."""

from __future__ import annotations

import hashlib
from pathlib import Path

WEIGHT_PATTERNS = ("*.safetensors", "*.bin")

WEIGHTS_RELEASED = "weights-released.json"
"""Left in a checkpoint directory whose weights were deleted on purpose once evaluated (``study
--keep-weights none``): why, the weights' sha256, and the command that writes them again."""


def released_weights(directory: str | Path) -> dict | None:
    """What :data:`WEIGHTS_RELEASED` in ``directory`` says when its weights were deleted on purpose (the note
    there and no weight file), not lost; None otherwise."""
    import json

    marker = Path(directory) / WEIGHTS_RELEASED
    try:
        found = json.loads(marker.read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) and not has_weight_files(directory) else None


def has_weight_files(directory: str | Path) -> bool:
    """Whether ``directory`` holds any weight file (a checkpoint copied without its weights holds none)."""
    return any(next(Path(directory).glob(pattern), None) is not None for pattern in WEIGHT_PATTERNS)


def weight_files(directory: str | Path) -> list[Path]:
    """The weight files of a checkpoint directory, in name order."""
    return sorted({path for pattern in WEIGHT_PATTERNS for path in Path(directory).glob(pattern)})


def weights_sha256(directory: str | Path) -> str:
    """sha256 over the weight files of a checkpoint directory, in name order (names included).

    Raises:
        FileNotFoundError: when the directory holds no weight file.
    """
    files = weight_files(directory)
    if not files:
        raise FileNotFoundError(f"no weight files (*.safetensors, *.bin) in {directory}")
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode())
        with path.open("rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()
