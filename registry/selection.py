"""``<objective>-best``: the registered variant an objective's alias points at.

Chosen among the variants whose search *used* that objective (objective-free searches, whose choice ignores
it — :data:`depthprune.core.objectives.OBJECTIVE_FREE_SEARCHES` — never stand in, and neither do healed
variants), by the lowest validation loss the quality gate recorded (``quality["validation_loss"]``).
"""

from __future__ import annotations

import math

from depthprune.core.errors import UserError
from depthprune.core.objectives import OBJECTIVE_FREE_SEARCHES, canonical_objective, get_objective
from registry.records import VariantInfo


def validation_loss(variant: VariantInfo) -> float | None:
    """The variant's recorded validation loss, or None (registered before the gate, or not a number)."""
    value = (variant.quality or {}).get("validation_loss")
    return value if isinstance(value, int | float) and not math.isnan(value) else None


def best_for_objective(registry, objective: str, base_model: str | None = None) -> VariantInfo:
    """The variant with the lowest validation loss among those a search chose under ``objective``.

    Raises:
        UserError: no such variant (says why), or several base models qualify and none was named.
    """
    objective = get_objective(canonical_objective(objective)).name
    candidates = [
        variant
        for variant in registry.list_variants(base_model)
        if variant.objective == objective
        and variant.search not in OBJECTIVE_FREE_SEARCHES
        and variant.healing is None
        and validation_loss(variant) is not None
    ]
    if not candidates:
        free = ", ".join(sorted(OBJECTIVE_FREE_SEARCHES))
        raise UserError(
            f"no variant{f' of {base_model}' if base_model else ''} was chosen by a search that used "
            f"objective {objective!r} and has a validation loss (objective-free searches never count: "
            f"{free}): run prune --objective {objective} with another search"
        )
    bases = {variant.base_model for variant in candidates}
    if len(bases) > 1:
        raise UserError(f"variants of several base models qualify ({', '.join(sorted(bases))}): pass --base")
    return min(candidates, key=validation_loss)
