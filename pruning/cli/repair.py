"""``prune --heal patch``: the selected variant repaired right after the search, both registered, the choice
re-decided with the child.

The patch's settings are checked with the prune command's own, before any model loads (text data, a known
method); after the searches, the variant the run selected (best on held-out validation) is handed to
``heal --method patch`` with its defaults, planned for memory like ``heal`` itself, and the patched child is
registered with the selected variant as its parent. The child is scored whole by the parent's validation
scorer, on the parent's validation data (:func:`pruning.pipeline.heldout.repaired_quality`), and its quality
record (validation loss, held-out perplexity, ``fit``) is stored as ``prune`` stores a variant's.

Then the run's choice is re-decided with the child included: it replaces its parent as the choice when its
validation loss is lower (the healed line's ``selected``; the variants' lines, printed before the repair, keep
the searches' choice). ``prune`` sets no alias, with or without ``--heal``; it prints what
``depthprune variants alias --best OBJECTIVE`` now chooses (repaired children compete for
``<objective>-best``: :mod:`registry.selection`) and whether an existing alias points elsewhere. Training
methods are not offered here: they take minutes to hours, so they stay a separate ``depthprune heal``.
"""

from __future__ import annotations

import dataclasses

from ground.core.errors import UserError
from pruning.calibration.data.items import TEXT
from pruning.calibration.data.specs import spec_kind

PRUNE_HEAL_METHODS = ("patch",)
"""What ``prune --heal`` runs: training-free methods only."""


def patch_request(method: str | None, heal_data: str | None, config):
    """The :class:`~pruning.healing.config.HealConfig` ``prune --heal`` will run (its variant filled in after
    the search), or None without ``--heal``; ``config`` is the prune run's PruneConfig.

    Raises:
        UserError: an unknown method, or data the patch cannot use (multiple-choice items).
    """
    from pruning.healing.config import HealConfig

    if method is None:
        if heal_data is not None:
            raise UserError("--heal-data applies with --heal patch only")
        return None
    if method not in PRUNE_HEAL_METHODS:
        raise UserError(
            f"--heal must be one of {', '.join(PRUNE_HEAL_METHODS)}, got {method!r} "
            "(train with depthprune heal)"
        )
    data = heal_data or config.calibration.data
    if spec_kind(data) != TEXT:
        raise UserError(
            f"--heal patch needs text activations and {data!r} is multiple-choice: pass --heal-data with "
            "text (e.g. pydoc, c4, text:PATH)"
        )
    return HealConfig(
        variant="(selected)",
        data=data,
        method=method,
        seq_len=config.calibration.seq_len,  # the windows the search was calibrated on
        registry_url=config.registry_url,
        out=config.out,
        device=config.device,
        dtype=config.dtype,
    )


def repair_selected(outcomes, request, plan_request):
    """Run ``request`` on the selected outcome of a prune run and re-decide the choice with the child
    (:func:`replaces`); its heal outcome (``selected`` set), or None when none is selected."""
    from pruning.healing.heal import heal
    from pruning.pipeline.heldout import repaired_quality
    from pruning.runtime.plans import plan_heal_run

    selected = [outcome for outcome in outcomes if outcome.selected]
    if not selected:
        return None
    config = plan_heal_run(dataclasses.replace(request, variant=selected[0].name), plan_request)
    healed = heal(config, assess_child=repaired_quality)
    healed.selected = replaces(selected[0], healed)
    return healed


def replaces(parent, healed) -> bool:
    """Whether the repaired child replaces ``parent`` (the run's selected outcome) as the run's choice: its
    validation loss is strictly lower (on a tie the parent stays, as :func:`~pruning.pipeline.
    heldout_selection.mark_selected` keeps the first)."""
    return (
        healed.validation_loss is not None
        and parent.validation_loss is not None
        and healed.validation_loss < parent.validation_loss
    )


def choice_notes(parent, healed, registry_url: str | None) -> list[str]:
    """What the repair changed about the run's choice and ``<objective>-best``, in words (printed after the
    healed line: a choice that moves to the child must not surprise anyone)."""
    from pruning.pipeline.heldout import incomparable

    if healed.validation_loss is None:
        why = incomparable(parent.calibration, parent.quality) or "it was not scored"
        return [
            f"{healed.name} has no validation loss comparable with {parent.name}'s ({why}): it competes "
            "neither for the run's choice nor for an <objective>-best alias"
        ]
    if healed.selected:
        notes = [
            f"run's choice: {healed.name} replaces {parent.name} (validation loss "
            f"{healed.validation_loss:.4f} < {parent.validation_loss:.4f}); its speed is its parent's (same "
            "blocks and shapes)"
        ]
    else:
        notes = [f"run's choice stays {parent.name}: the repair did not lower the validation loss"]
    return notes + alias_notes(parent.calibration["objective"], healed.name, registry_url)


def alias_notes(objective: str, child: str, registry_url: str | None) -> list[str]:
    """Where ``<objective>-best`` points and what ``variants alias --best`` would choose now, when they
    differ (``prune`` sets no alias)."""
    from ground.core.objectives import best_alias, canonical_objective
    from registry import open_registry
    from registry.selection import best_for_objective

    objective = canonical_objective(objective)
    alias = best_alias(objective)
    with open_registry(registry_url) as registry:
        base = registry.resolve(child).base_model
        try:
            best = best_for_objective(registry, objective, base).name
        except UserError:
            return []
        current = registry.aliases().get(f"{alias}@{base}")
    if current == best:
        return [f"{alias} -> {best} (already)"]
    pointing = f"points at {current}" if current else "is not set"
    return [
        f"{alias} {pointing}; repaired children compete for it, and `depthprune variants alias --best "
        f"{objective}` would now choose {best}"
    ]
