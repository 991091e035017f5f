"""Find N (blocks of the base model) and M (blocks removed) of each served model, for the ideal speedup.

Sources, first that answers wins: the user's ``--blocks NAME=N:M``; the registry (``--registry``);
the gateway's ``/v1/models`` entry (``num_blocks``, ``removed_blocks``); the model directory the server
names as ``root`` when it is on this machine (``pruning.json`` of a variant, ``config.json`` of a dense
model). None when no source knows: the report then shows measured ratios without an ideal.
"""

from __future__ import annotations

import json
from pathlib import Path

from ground.core.errors import UserError
from loadtest.compare import BlockCounts


def counts_from_card(card: dict) -> BlockCounts | None:
    """N and M from a gateway ``/v1/models`` entry, when it carries them."""
    removed = card.get("removed_blocks")
    num_blocks = card.get("num_blocks")
    if isinstance(num_blocks, int) and isinstance(removed, list):
        return BlockCounts(num_blocks, len(removed), source="/v1/models")
    return None


def counts_from_directory(root: str | None) -> BlockCounts | None:
    """N and M from a local model directory: ``pruning.json`` of a variant, else ``config.json`` (dense)."""
    if not root:
        return None
    directory = Path(root)
    try:
        pruning = directory / "pruning.json"
        if pruning.is_file():
            record = json.loads(pruning.read_text())
            return BlockCounts(
                int(record["base_num_blocks"]), len(record["removed_blocks"]), source="pruning.json"
            )
        config = directory / "config.json"
        if config.is_file():
            record = json.loads(config.read_text())
            record = record.get("text_config", record)
            if isinstance(record.get("num_hidden_layers"), int):
                return BlockCounts(record["num_hidden_layers"], 0, source="config.json")
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return None


def counts_from_registry(registry, name: str) -> BlockCounts | None:
    """N and M of ``name`` (variant, alias or ``dense``) in the registry; None when it is not there."""
    try:
        info = registry.resolve(name)
    except UserError:
        return None
    return BlockCounts(int(info.num_blocks), len(info.removed_blocks), source="registry")


def block_counts(
    models: list[str],
    cards: dict[str, dict],
    overrides: dict[str, BlockCounts],
    registry=None,
) -> dict[str, BlockCounts | None]:
    """``model -> BlockCounts`` (or None) for every benchmarked model, by the order of sources above."""
    unknown = sorted(set(overrides) - set(models))
    if unknown:
        raise UserError(f"--blocks names models that are not benchmarked: {', '.join(unknown)}")
    counts: dict[str, BlockCounts | None] = {}
    for model in models:
        card = cards.get(model, {})
        counts[model] = (
            overrides.get(model)
            or (counts_from_registry(registry, model) if registry is not None else None)
            or counts_from_card(card)
            or counts_from_directory(card.get("root"))
        )
    return counts
