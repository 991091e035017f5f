"""``prune --heal patch``: the selected variant repaired right after the search, both registered.

The patch's settings are checked with the prune command's own, before any model loads (text data, a known
method); after the searches, the variant the run selected (best on held-out validation) is handed to
``heal --method patch`` with its defaults, planned for memory like ``heal`` itself, and the patched child is
registered with the selected variant as its parent (the run's quality gate and aliases are not re-decided with
it). Training methods are not offered here: they take minutes to hours, so they stay a
separate ``depthprune heal``.
"""

from __future__ import annotations

import dataclasses

from depthprune.core.errors import UserError
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
    """Run ``request`` on the selected outcome of a prune run; its heal outcome, or None when none is."""
    from pruning.healing.heal import heal
    from pruning.runtime.plans import plan_heal_run

    selected = [outcome for outcome in outcomes if outcome.selected]
    if not selected:
        return None
    config = plan_heal_run(dataclasses.replace(request, variant=selected[0].name), plan_request)
    return heal(config)
