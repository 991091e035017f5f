"""Manifests of the files that define a model, taken at registration and checked before every serve.

A model directory is more than its weights: vLLM also reads ``config.json`` (layer count, rope, vocabulary),
the tokenizer files, ``generation_config.json`` (default sampling) and a chat template. Changing any of them
changes what is served. So when a variant's checkpoint or a base model's directory is registered, the
registry stores a *manifest*, ``{file name: sha256}`` of every such file
(``VariantInfo.checkpoint_files``, ``BaseModelInfo.model_files``), and :func:`check_model_files` compares
the directory with it before a backend is started or restarted; a file changed, missing or added (a second
weights file) is refused with its name. Other files (``README.md``, notes) may change freely.

The weights checksum (:func:`ground.core.checksums.weights_sha256`) stays as it was, the identity of the
weights that pruning and the variants' ``base_weights_sha256`` refer to; :func:`hash_model_files` computes it
in the same pass. Rows registered before manifests existed have none: they are checked by that checksum
alone, until they are registered again.
"""

from __future__ import annotations

import fnmatch
import hashlib
from dataclasses import dataclass
from pathlib import Path

from ground.core.checksums import WEIGHT_PATTERNS, released_weights, weights_sha256
from ground.core.errors import UserError

MODEL_FILE_PATTERNS = (
    *WEIGHT_PATTERNS,
    "*.json",  # config, generation_config, tokenizer*, special_tokens_map, weight index, pruning.json
    "tokenizer.model",
    "*.tiktoken",
    "vocab.txt",
    "merges.txt",
    "*.jinja",
)
"""File names (in the directory itself, as vLLM and transformers read them) that define a model."""
CHUNK_BYTES = 1 << 20


@dataclass(frozen=True)
class ModelFiles:
    """What :func:`hash_model_files` found in one directory."""

    files: dict[str, str]
    """The manifest: ``{file name: sha256 of its bytes}``, sorted by name."""
    weights_sha256: str
    """:func:`ground.core.checksums.weights_sha256` of the same directory."""


def is_model_file(name: str) -> bool:
    """Whether a file of this name defines the model (see :data:`MODEL_FILE_PATTERNS`)."""
    return any(fnmatch.fnmatch(name, pattern) for pattern in MODEL_FILE_PATTERNS)


def model_file_names(directory: Path) -> list[str]:
    """The names of the files in ``directory`` that define the model, sorted."""
    return sorted(path.name for path in directory.iterdir() if path.is_file() and is_model_file(path.name))


def hash_model_files(directory: str | Path) -> ModelFiles:
    """Hash every file that defines the model in ``directory``, reading each once.

    Args:
        directory: a checkpoint or base model directory.

    Returns:
        The manifest and the weights checksum.

    Raises:
        FileNotFoundError: the directory holds no weight file.
    """
    directory = Path(directory)
    weights = hashlib.sha256()
    files: dict[str, str] = {}
    found_weights = False
    for name in model_file_names(directory):
        is_weights = any(fnmatch.fnmatch(name, pattern) for pattern in WEIGHT_PATTERNS)
        found_weights |= is_weights
        if is_weights:  # the same bytes, in the same order, as ground.core.checksums.weights_sha256
            weights.update(name.encode())
        digest = hashlib.sha256()
        with (directory / name).open("rb") as handle:
            for chunk in iter(lambda: handle.read(CHUNK_BYTES), b""):
                digest.update(chunk)
                if is_weights:
                    weights.update(chunk)
        files[name] = digest.hexdigest()
    if not found_weights:
        raise FileNotFoundError(f"no weight files ({', '.join(WEIGHT_PATTERNS)}) in {directory}")
    return ModelFiles(files, weights.hexdigest())


def manifest_differences(directory: Path, files: dict[str, str]) -> list[str]:
    """``["changed config.json", "missing tokenizer.json", "added extra.safetensors"]``, empty when equal."""
    actual = hash_model_files(directory).files if model_file_names(directory) else {}
    differences = [f"changed {name}" for name in files if name in actual and actual[name] != files[name]]
    differences += [f"missing {name}" for name in files if name not in actual]
    differences += [f"added {name}" for name in actual if name not in files]
    return differences


def check_model_files(
    directory: str | Path, label: str, *, files: dict[str, str] | None, weights_checksum: str | None
) -> None:
    """Refuse a model directory that is not what was registered.

    Args:
        directory: the checkpoint or base model directory.
        label: how messages name the model (``'ppl-best'``, ``'dense@org/model'``).
        files: the registered manifest; None for a row registered before manifests (weights only).
        weights_checksum: the registered weights checksum, used when there is no manifest.

    Raises:
        UserError: one line naming the directory and each file that changed, went missing or was added.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise UserError(f"checkpoint of {label!r} is missing: {directory} is not a directory")
    released = released_weights(directory)
    if released is not None:
        raise UserError(
            f"the weights of {label!r} were not kept ({released.get('reason', 'released')}); write them "
            f"again with `{released.get('rebuild', 'depthprune checkpoint')}`"
        )
    if files:
        differences = manifest_differences(directory, files)
        if differences:
            raise UserError(
                f"checkpoint of {label!r} at {directory} was modified since it was registered: "
                f"{', '.join(differences)}; restore it, or re-register it if the change is intended"
            )
        return
    if not weights_checksum:
        raise UserError(
            f"checkpoint of {label!r} has no recorded sha256, so it cannot be verified; "
            "register it again with its checksum"
        )
    try:
        actual = weights_sha256(directory)
    except FileNotFoundError as error:
        raise UserError(f"checkpoint of {label!r} is not usable: {error}") from None
    if actual != weights_checksum:
        raise UserError(
            f"checkpoint of {label!r} at {directory} was modified: weights sha256 {actual[:12]}... "
            f"!= registered {weights_checksum[:12]}...; re-create or re-register it"
        )
