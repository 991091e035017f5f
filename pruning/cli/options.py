"""The ``prune`` options that configure an objective, its data's held-out use and the quality gate, and the
``heal`` options of its training-free patch and its last-blocks baseline.

Kept apart from :mod:`pruning.cli.commands` (the commands) so that the commands module stays one job; each
alias is a ``typer`` option type the commands share.
"""

from __future__ import annotations

from typing import Annotated

import typer

from depthprune.core.objectives import OBJECTIVES

_CLIPPED = ", ".join(name for name, objective in OBJECTIVES.items() if "margin_clip" in objective.parameters)

MarginClipOption = Annotated[
    float | None,
    typer.Option(
        help=f"{_CLIPPED}: clip each item's margin to [-TAU, TAU] (a bounded margin; default: PuDDing's "
        "unbounded one). Recorded in the calibration configuration and the variant's name.",
        metavar="TAU",
    ),
]
KlWeightOption = Annotated[
    float,
    typer.Option(
        help="Add LAMBDA x KL(dense || pruned) on the same sequences to the objective (multiple choice: over "
        "the prompt and answer positions). Recorded in the calibration configuration and the variant's name.",
        metavar="LAMBDA",
    ),
]
TruncateOption = Annotated[
    bool,
    typer.Option(
        "--truncate",
        help="Cut multiple-choice items longer than --seq-len from the left (recorded as truncated_items) "
        "instead of refusing them.",
    ),
]
ValidationOption = Annotated[
    str | None,
    typer.Option(
        help="Held-out data of the objective's kind on which every search's outcome is scored to select one "
        "(mc:PATH, text:PATH, any data spec). Default: the calibration source's calibration split minus "
        "the calibration draw (docs/objectives.md).",
        metavar="SPEC",
    ),
]
MaxPerplexityRatioOption = Annotated[
    float,
    typer.Option(
        help="Quality gate: a variant whose held-out perplexity exceeds K x the dense model's is fit: false "
        "(as is one whose task accuracy falls to chance).",
        metavar="K",
    ),
]

LastBlocksOption = Annotated[
    int | None,
    typer.Option(
        help="last-blocks: train the LM head and the last K blocks (default 3, as Reassessing Layer "
        "Pruning).",
        metavar="K",
    ),
]
"""``heal --last-blocks``."""
EstimatorOption = Annotated[
    str | None,
    typer.Option(
        help="patch: lstsq (ReplaceMe's closed-form least squares, the default) or cosine (ReplaceMe's "
        "cosine objective, Adam from the identity for 10 epochs at --lr).",
    ),
]
"""``heal --estimator``."""
RidgeOption = Annotated[
    float | None,
    typer.Option(
        help="patch, lstsq: ridge term added to the normal equations (ReplaceMe's alpha; default 0).",
        metavar="ALPHA",
    ),
]
"""``heal --ridge``."""
PatchSamplesOption = Annotated[
    int | None,
    typer.Option(
        help="patch: calibration windows of --seq-len tokens, at most (a seeded draw; default 128, as "
        "ReplaceMe's example configs).",
        metavar="N",
    ),
]
"""``heal --patch-samples``."""
PruneHealOption = Annotated[
    str | None,
    typer.Option(
        "--heal",
        help="patch: repair the selected variant right after the search (heal --method patch, its defaults) "
        "and register both, the patched one as the selected one's child.",
    ),
]
"""``prune --heal``."""
PruneHealDataOption = Annotated[
    str | None,
    typer.Option(
        help="With --heal: text the patch is estimated on (default: the calibration data).", metavar="SPEC"
    ),
]
"""``prune --heal-data``."""
