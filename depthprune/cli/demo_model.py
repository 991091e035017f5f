"""``depthprune demo-model``: build (or reuse) the demo model and print its quality.

Training imports torch inside :func:`ground.demo.model.ensure_demo_model`, so ``--help`` stays fast.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from ground.core.cli_options import Override, option_group, with_options
from ground.core.errors import UserError
from ground.core.options import JsonOptions
from ground.demo.recipe import RECIPES


@option_group
@dataclass(frozen=True)
class DemoModelOptions:
    """``demo-model``: which recipe, where, and whether to rebuild."""

    out: Path | None = None
    """Directory for the model (default: $DEPTHPRUNE_HOME/models/demo-<recipe hash>)."""
    recipe: str = "default"
    """default (16 blocks, hidden 256; a few minutes on 2 cores) or tiny (8 blocks, hidden 64; seconds, for
    tests)."""
    force: bool = False
    """Rebuild even if the cached model exists; replace a demo model of another recipe at --out."""


@with_options
def demo_model(
    options: DemoModelOptions,
    output: Annotated[JsonOptions, Override(as_json="Print path, recipe hash and quality as JSON.")],
) -> None:
    """Build (or reuse) the demo model: a small Llama trained here on a generated corpus, with held-out data.

    Prints where the model is and its quality: held-out perplexity against a unigram model, and QA accuracy
    against chance. The build is cached by a hash of the recipe.
    """
    from ground.demo.model import ensure_demo_model, read_quality

    recipe, as_json = options.recipe, output.as_json
    if recipe not in RECIPES:
        raise UserError(f"unknown recipe {recipe!r}; choose one of: {', '.join(RECIPES)}")
    chosen = RECIPES[recipe]()
    path = ensure_demo_model(chosen, out=options.out, progress=not as_json, force=options.force)
    quality = read_quality(path)
    if as_json:
        print(
            json.dumps(
                {"path": str(path), "recipe": recipe, "recipe_hash": chosen.hash(), "quality": quality}
            )
        )
        return
    print(f"demo model ({recipe} recipe, {chosen.hash()}): {path}")
    print(
        f"  held-out perplexity {quality['perplexity']:.2f} vs unigram {quality['unigram_perplexity']:.2f} "
        f"(ratio {quality['perplexity_ratio']:.3f})"
    )
    print(
        f"  QA accuracy {quality['qa_accuracy']:.3f} vs chance {quality['qa_chance']:.3f} "
        f"on {quality['qa_items']} held-out items"
    )
    print(
        f"  trained on {quality['train_tokens']:,} tokens in {quality['train_seconds']:.0f} s "
        f"({quality['tokens_per_second']:.0f} tokens/s)"
    )
    print(f"  data: {path / 'data'}")
