"""Names, identities and JSON normal forms used by the registry (pure functions, no database).

A variant is identified by (base model, removed set, calibration configuration, search algorithm);
:func:`identity_hash` turns that into a fixed-length key so that the database can enforce it with a
unique index whatever the size of the calibration dictionary.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path
from typing import Any

from ground.core.errors import UserError

DENSE = "dense"
"""The name under which every base model itself is servable."""
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:+-]{0,127}")
"""A variant or alias name, matched whole (``fullmatch``: a ``$`` would let a final newline through)."""
QUALIFIER = "@"
"""``NAME@BASE`` picks the alias (or ``dense``) of one base model when several base models have it."""


def check_name(name: str, what: str) -> str:
    """Return ``name`` if it can name a variant or alias, else raise a :class:`UserError`.

    Names are served as vLLM ``--served-model-name`` and typed on command lines, so they are short,
    start with a letter or digit, and hold no spaces, slashes or ``@``; all-digit names would be read
    as registry ids, and ``dense`` is reserved for the base model.
    """
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise UserError(
            f"{what} {name!r} is not a valid name: use 1-128 letters, digits and . _ - + :, "
            "starting with a letter or digit"
        )
    if name.isdigit():
        raise UserError(f"{what} {name!r} is all digits, which would read as a registry id")
    if name == DENSE:
        raise UserError(f"{what} {name!r} is reserved for the dense base model")
    return name


def normalise_model(model: str) -> str:
    """A base model's registry key: an existing local directory becomes its absolute path, a hub id stays."""
    if not isinstance(model, str) or not model.strip():
        raise UserError(f"base model must be a hub id or a directory, got {model!r}")
    model = model.strip()
    candidate = Path(model).expanduser()
    if candidate.exists():
        return str(candidate.resolve())
    return model


def model_slug(model: str) -> str:
    """A short, name-safe form of a base model (``meta-llama/Llama-3-8B`` -> ``llama-3-8b``).

    A checkpoint converted from a GGUF file (a ``source.json`` beside its config) is named after its source
    (``smollm2-135m``), not after its cache directory's hash.
    """
    tail = _converted_label(model) or model.rstrip("/").split("/")[-1] or "model"
    slug = re.sub(r"[^a-z0-9.+-]+", "-", tail.lower()).strip("-.")
    return slug[:48] or "model"


def _converted_label(model: str) -> str | None:
    """The embedded name or GGUF file name recorded in a converted checkpoint's ``source.json``, if any."""
    try:
        source = json.loads((Path(model).expanduser() / "source.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(source, dict):
        return None
    return source.get("embedded_name") or Path(str(source.get("path", ""))).name.removesuffix(".gguf") or None


def _to_json_value(value: Any) -> Any:
    """Make ``value`` storable as JSON in every backend (PostgreSQL's JSON rejects NaN and infinities)."""
    if isinstance(value, dict):
        return {str(key): _to_json_value(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_json_value(item) for item in value]
    if isinstance(value, (set, frozenset)):
        return sorted(_to_json_value(item) for item in value)
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "item") and callable(value.item):  # numpy scalars, without importing numpy
        return _to_json_value(value.item())
    raise TypeError(f"{type(value).__name__} is not JSON-serialisable")


def json_dict(value: Any, what: str) -> dict:
    """``value`` as a JSON-ready dict (``None`` -> ``{}``), or a :class:`UserError` naming ``what``."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise UserError(f"{what} must be a dict, got {type(value).__name__}")
    try:
        return _to_json_value(value)
    except TypeError as error:
        raise UserError(f"{what} cannot be stored: {error}") from None


def canonical_json(value: Any) -> str:
    """One string per value: sorted keys, no spaces (the input of identity hashes)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def identity_hash(*parts: Any) -> str:
    """sha256 of the canonical JSON of ``parts``."""
    return hashlib.sha256(canonical_json(list(parts)).encode()).hexdigest()


def auto_variant_name(
    base_model: str, objective: str, search: str, removed_blocks: list[int], identity: str
) -> str:
    """A readable, unique default name: ``llama-3-8b-ppl-greedy-m7-1a2b3c``."""
    objective_part = re.sub(r"[^a-z0-9]+", "-", objective.lower()).strip("-") or "objective"
    search_part = re.sub(r"[^a-z0-9]+", "-", search.lower()).strip("-") or "search"
    return f"{model_slug(base_model)}-{objective_part}-{search_part}-m{len(removed_blocks)}-{identity[:6]}"


def split_qualified(reference: str) -> tuple[str, str | None]:
    """``"ppl-best@llama"`` -> ``("ppl-best", "llama")``; an unqualified name -> ``(name, None)``."""
    if QUALIFIER in reference:
        name, _, base = reference.rpartition(QUALIFIER)
        if name and base:
            return name, base
    return reference, None


def required_text(value: Any, what: str) -> str:
    """``value`` stripped, or a :class:`UserError` naming ``what`` when it is not a non-empty string."""
    if not isinstance(value, str) or not value.strip():
        raise UserError(f"{what} must be a non-empty string, got {value!r}")
    return value.strip()


def optional_float(value: Any, what: str) -> float | None:
    """A number (numpy scalars included) as a plain float; ``None`` and NaN give ``None``.

    Raises:
        UserError: naming ``what``, when ``value`` is not a number.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) and not hasattr(value, "item"):
        raise UserError(f"{what} must be a number, got {value!r}")
    number = float(value.item() if hasattr(value, "item") else value)
    return None if math.isnan(number) else number


def optional_count(value: Any, what: str) -> int | None:
    """A non-negative integer (numpy scalars included) as a plain int, or ``None``.

    Raises:
        UserError: naming ``what``, when ``value`` is not a non-negative integer.
    """
    if value is None:
        return None
    if hasattr(value, "item") and callable(value.item):
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise UserError(f"{what} must be a non-negative integer, got {value!r}")
    return value


def block_indices(removed_blocks: Any) -> list[int]:
    """The removal set as sorted plain ints, checked for what needs no base model: integers, no repeats.

    Raises:
        UserError: on something that is not a list of indices, a non-integer or a repeated index.
    """
    if isinstance(removed_blocks, (str, bytes)) or not hasattr(removed_blocks, "__iter__"):
        raise UserError(f"removed_blocks must be a list of block indices, got {removed_blocks!r}")
    indices = []
    for index in removed_blocks:
        if hasattr(index, "item") and callable(index.item):
            index = index.item()
        if isinstance(index, bool) or not isinstance(index, int):
            raise UserError(f"removed block index {index!r} is not an integer")
        indices.append(index)
    if len(set(indices)) != len(indices):
        raise UserError(f"removed_blocks {list(removed_blocks)} names a block more than once")
    return sorted(indices)


def parse_removed_blocks(removed_blocks: Any, num_blocks: int) -> list[int]:
    """The sorted removal set, checked against the base model's block count.

    Raises:
        UserError: on a non-integer, out-of-range or repeated index, or when nothing would be left.
    """
    indices = block_indices(removed_blocks)
    for index in indices:
        if not 0 <= index < num_blocks:
            raise UserError(
                f"removed block {index} is out of range: the base model has {num_blocks} blocks "
                f"(0..{num_blocks - 1})"
            )
    if not 1 <= len(indices) < num_blocks:
        raise UserError(
            f"a variant removes between 1 and {num_blocks - 1} of the {num_blocks} blocks, got {len(indices)}"
        )
    return indices


def kept_to_original(removed_blocks: list[int], num_blocks: int) -> list[int]:
    """``kept[new_index] = original_index`` for the blocks that remain."""
    removed = set(removed_blocks)
    return [index for index in range(num_blocks) if index not in removed]


def block_mask(removed_blocks: list[int], num_blocks: int, kept: str = "■", dropped: str = "□") -> str:
    """One character per original block: ``■`` kept, ``□`` removed."""
    removed = set(removed_blocks)
    return "".join(dropped if index in removed else kept for index in range(num_blocks))


def display_number(value: Any, digits: int = 4) -> str:
    """A table cell of the registry's tables: a float to ``digits`` significant digits, None as ``—``."""
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)
