"""The demo's repair step: ``ppl-best`` patched without training, shown beside its parent, never served.

After pruning, :func:`repair_best` runs ``heal --method patch`` (ReplaceMe's closed-form linear map, its
defaults: ``lstsq``, no ridge, at most 128 calibration windows) on the perplexity objective's best variant, on
that objective's calibration data in windows of the calibration's length, the child scored on the parent's
validation data (:func:`pruning.pipeline.heldout.repaired_quality`). The demo evaluates it with the other
variants and shows it as the row :data:`REPAIRED_ROW`. It is not load-tested: it has its parent's blocks,
shapes and parameter count, so its speed is its parent's by construction (the tables say so).

Real models only: the demo model (``--model demo``) is its own small test of the pipeline and keeps its steps.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

from ground.core.errors import UserError

REPAIRED_ROW = "ppl-best+patch"
"""The repaired child's row in the demo's tables."""
PARENT_ROLE = "ppl-best"
"""The alias of the variant the demo repairs (the perplexity objective's best searched variant)."""
HELD_OUT_WINDOWS = 16
"""``heal --eval-windows`` of the demo's patch: its before/after held-out loss (the quality table is what
the demo reads; heal's default 64 would cost four times as much)."""
TOKENS_PER_SECOND = 800.0
"""SmolLM2-135M's forward on 2 cores (REAL_SIZES: ~5 s per 16 x 256-token subset evaluation): the cost
estimate's rate."""
FIXED_SECONDS = 25.0
"""Loading the dense model and the variant twice, and the solve: the estimate's constant part."""


@dataclass(frozen=True)
class Repaired:
    """The demo's repaired child."""

    name: str
    """Its registry name."""
    parent: str
    """The registry name of the variant it repairs (``ppl-best``'s)."""
    seconds: float
    """Wall time of the step (patch and scoring), measured."""


def patch_settings(plan) -> tuple[int, int]:
    """``(windows, tokens per window)`` of the demo's patch on ``plan``."""
    from pruning.healing.config import DEFAULT_PATCH_SAMPLES

    return plan.sizes.patch_windows or DEFAULT_PATCH_SAMPLES, plan.sizes.seq_len


def estimated_seconds(plan) -> float:
    """The repair step's cost on 2 cores, from the tokens it runs: the calibration windows through the dense
    model, the held-out loss twice and the validation data twice through the child, and its evaluation
    (the suite's windows and items) at :data:`TOKENS_PER_SECOND`."""
    windows, length = patch_settings(plan)
    kept = 1 - plan.drop / plan.num_blocks
    limit = plan.sizes.eval_limit or 64
    child_tokens = kept * (2 * HELD_OUT_WINDOWS * length + 2 * plan.sizes.text_samples * plan.sizes.seq_len)
    child_tokens += kept * 2 * limit * plan.sizes.eval_seq_len  # the suite's perplexity and accuracy tasks
    return FIXED_SECONDS + (windows * length + child_tokens) / TOKENS_PER_SECOND


def describe(plan) -> str:
    """The plan's line for the step (:meth:`depthprune.cli.demo.DemoPlan.describe`)."""
    windows, length = patch_settings(plan)
    return (
        f"  repair: {PARENT_ROLE} patched without training (heal --method patch: <= {windows} windows x "
        f"{length} tokens of {plan.data['perplexity']}), evaluated as the others, not served (its speed is "
        f"its parent's); about {estimated_seconds(plan):.0f} s"
    )


def repair_best(config, plan, registry, base_model: str, say) -> Repaired | None:
    """Patch the perplexity objective's best variant and register the child; None when it cannot be patched
    (the reason printed) or the plan has no repair step."""
    from pruning.healing.config import HealConfig
    from pruning.healing.heal import heal
    from pruning.pipeline.heldout import repaired_quality

    if not plan.repair:
        return None
    parent = registry.resolve(f"{PARENT_ROLE}@{base_model}")
    windows, length = patch_settings(plan)
    say(
        config,
        f"repair {PARENT_ROLE} without training: a linear map per removed span from <= {windows} windows x "
        f"{length} tokens (estimated {estimated_seconds(plan):.0f} s with its evaluation)",
    )
    started = time.monotonic()
    request = HealConfig(
        variant=parent.name,
        data=plan.data["perplexity"],
        method="patch",
        seq_len=length,
        patch_samples=windows,
        eval_windows=HELD_OUT_WINDOWS,
        registry_url=config.registry_url,
    )
    try:
        outcome = heal(request, assess_child=repaired_quality)
    except UserError as error:
        print(f"   not repaired: {error}", file=sys.stderr)
        return None
    before, after = outcome.parent_validation_loss, outcome.validation_loss
    print(
        f"   {outcome.name}: validation loss "
        + (f"{before:.3f} -> {after:.3f}" if after is not None else "not comparable")
        + f", held-out loss {outcome.losses['heldout_before']:.3f} -> "
        f"{outcome.losses['heldout']:.3f}, patched in {outcome.wall_seconds:.0f} s",
        file=sys.stderr,
    )
    return Repaired(outcome.name, parent.name, time.monotonic() - started)


def repaired_row(repaired: Repaired, child, metrics: dict, quality: dict) -> dict:
    """The child's summary row (``summary.json`` and the tables): its removal, objective, validation loss and
    quality; no speed (``speed_of``: the row whose speed it has)."""
    from depthprune.cli.demo_table import speed_columns

    return {
        "variant": REPAIRED_ROW,
        "name": repaired.name,
        "parent": repaired.parent,
        "removed_blocks": child.removed_blocks,
        "objective": child.objective,
        "search": f"{child.search}+patch",
        "calibration_loss": None,  # the search's loss is the parent's; the child was not searched
        "validation_loss": (child.quality or {}).get("validation_loss"),
        "fit": child.fit,
        **metrics,
        "quality": quality,
        "repair_seconds": round(repaired.seconds, 1),
        "speed_of": PARENT_ROLE,
        **speed_columns(None),
    }


def with_repaired(rows: list[dict], row: dict) -> list[dict]:
    """``rows`` with the repaired child's row right after its parent's (at the end without one)."""
    at = next((index + 1 for index, item in enumerate(rows) if item["name"] == row["parent"]), len(rows))
    return [*rows[:at], row, *rows[at:]]
