"""``<objective>-best``: the registered variant an objective's alias points at.

Chosen by the lowest validation loss the quality gate recorded (``quality["validation_loss"]``) among the
variants of one base model whose search *used* that objective, that is:

* every variant a search chose under the objective, except objective-free searches, whose choice ignores it
  (:data:`ground.core.objectives.OBJECTIVE_FREE_SEARCHES`);
* and their **training-free repaired children** (``heal --method patch``, ``prune --heal patch``) that carry
  a validation loss: measured by the parent's scorer, on the parent's validation data, under the parent's
  objective (:func:`pruning.pipeline.heldout.repaired_quality`), so it compares with the searched variants'.
  A child carries its parent's calibration and search, so the children of objective-free searches stay out
  too, and so do children patched before their validation loss was recorded (none).

Children trained with ``lora``, ``distill`` or ``last-blocks`` never stand in: their record holds a held-out
loss on their training text's test split, not a validation loss comparable with the searched variants'.
"""

from __future__ import annotations

import math

from ground.core.errors import UserError
from ground.core.objectives import OBJECTIVE_FREE_SEARCHES, canonical_objective, get_objective
from registry.records import VariantInfo

REPAIR_METHODS = frozenset({"patch"})
"""Healing methods whose children compete for ``<objective>-best``: training-free, scored like a search's
variant (their validation loss is measured on the parent's validation data)."""


def validation_loss(variant: VariantInfo) -> float | None:
    """The variant's recorded validation loss, or None (registered before the gate, or not a number)."""
    value = (variant.quality or {}).get("validation_loss")
    return value if isinstance(value, int | float) and not math.isnan(value) else None


def is_repaired(variant: VariantInfo) -> bool:
    """Whether ``variant`` is a training-free repaired child (``heal --method patch``)."""
    return variant.healing is not None and variant.healing.get("method") in REPAIR_METHODS


def competes(variant: VariantInfo, objective: str, repaired: bool = True) -> bool:
    """Whether ``variant`` stands for ``objective`` (a canonical name) in :func:`best_for_objective`."""
    return (
        variant.objective == objective
        and variant.search not in OBJECTIVE_FREE_SEARCHES
        and (variant.healing is None or (repaired and is_repaired(variant)))
        and validation_loss(variant) is not None
    )


def best_for_objective(
    registry, objective: str, base_model: str | None = None, repaired: bool = True
) -> VariantInfo:
    """The variant with the lowest validation loss among those a search chose under ``objective`` and their
    training-free repaired children (module docstring).

    Args:
        registry: the open registry.
        objective: an objective's name or short name (``ppl``, ``ce``).
        base_model: the base model; None when only one has candidates.
        repaired: let repaired children compete; False: searched variants only (the demo serves those: a
            child's speed is its parent's).

    Raises:
        UserError: no such variant (says why), or several base models qualify and none was named.
    """
    objective = get_objective(canonical_objective(objective)).name
    candidates = [
        variant for variant in registry.list_variants(base_model) if competes(variant, objective, repaired)
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
