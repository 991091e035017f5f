"""Variants whose speed is another's by construction, so that the demo's load test measures it once.

Depth pruning removes whole blocks. Two variants that keep as many blocks of each kind (the config's
``layer_types``, full or sliding attention; one kind when it names none) run the same computation per token,
whichever blocks they kept, so vLLM serves them at the same speed within noise (the demo's two one_shot
variants of SmolLM2 measured 1.31x [1.29, 1.33] and 1.29x [1.25, 1.32]). The default demo load-tests the
first of them, which is what it must show (a variant clearly faster than dense, the A/A row at 1.00), and
says the other's speed is that one's; ``--precise`` measures every served variant.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

SPEED_TWIN_REASON = "the same number and kinds of blocks kept: the same computation per token"


def kept_kinds(removed_blocks, num_blocks: int, layer_types=None) -> tuple[tuple[str, int], ...]:
    """How many blocks of each kind a variant keeps."""
    removed = set(removed_blocks)
    kinds = layer_types or ["block"] * num_blocks
    return tuple(sorted(Counter(kinds[index] for index in range(num_blocks) if index not in removed).items()))


def speed_twins(removed_by_role: dict[str, list[int]], num_blocks: int, layer_types=None) -> dict[str, str]:
    """``role -> the earlier role whose speed it has``, for each role (in order) keeping what one before it
    keeps; the first of each is load-tested."""
    first_with: dict[tuple, str] = {}
    twins = {}
    for role, removed in removed_by_role.items():
        first = first_with.setdefault(kept_kinds(removed, num_blocks, layer_types), role)
        if first != role:
            twins[role] = first
    return twins


def served_speed_twins(registry, served: dict[str, str], model_dir: Path | str) -> dict[str, str]:
    """``role -> role`` of the served variants whose speed is an earlier one's, read from the registry and
    the model's config."""
    from pruning.model.blocks import load_config

    model = load_config(str(model_dir))
    removed = {
        role: registry.resolve(name).removed_blocks for role, name in served.items() if role != "dense"
    }
    return speed_twins(removed, int(model.num_hidden_layers), getattr(model, "layer_types", None))


def speed_twin(role: str | None, twins: dict[str, str]) -> dict:
    """A twin's row fields: whose speed it has, and why (the tables' note)."""
    if role not in twins:
        return {}
    return {"speed_of": twins[role], "speed_because": SPEED_TWIN_REASON}
