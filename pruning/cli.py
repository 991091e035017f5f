"""Command-line functions of the pruning side: ``demo-model``, ``checkpoint``, ``prune``,
``bench-evaluator``, ``eval`` and ``study``.

Each function's typed signature is its command line (typer). Heavy modules (torch, transformers) are
imported inside the functions so that ``depthprune --help`` stays fast.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer


def checkpoint(
    model: Annotated[str, typer.Option(help="Hub id or local directory of the dense model.")],
    remove: Annotated[str, typer.Option(help="Original indices of the blocks to remove, e.g. 3,7,8.")],
    out: Annotated[Path, typer.Option(help="Directory to write the pruned checkpoint to.")],
    revision: Annotated[str | None, typer.Option(help="Hub revision of the model.")] = None,
    dtype: Annotated[str | None, typer.Option(help="Save in this dtype (default: the model's own).")] = None,
    overwrite: Annotated[bool, typer.Option(help="Replace OUT if it exists.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print pruning.json as one JSON line.")] = False,
) -> None:
    """Write a variant of MODEL without the given blocks as an ordinary Hugging Face checkpoint."""
    from dataclasses import asdict

    from pruning.checkpoint import write_pruned_checkpoint
    from pruning.models import parse_block_list

    written = write_pruned_checkpoint(model, parse_block_list(remove), out, revision=revision, dtype=dtype,
                                      overwrite=overwrite)
    if as_json:
        print(json.dumps(asdict(written)))
    else:
        print(f"wrote {written.path}: removed blocks {written.removed_blocks} of {written.base_num_blocks} "
              f"({written.architecture}), weights sha256 {written.weights_sha256[:12]}")
