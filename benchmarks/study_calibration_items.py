"""Give a committed study's cells their ``calibration_items`` (issue 55 item 4) without running anything.

    python -m benchmarks.study_calibration_items docs/study-smollm2-135m/calibration-size [--write]

Each cell's calibration draw (its data spec, samples, sequence length, sampling and draw seed, as the
manifest records them) is made again with the model's tokenizer and its documents or questions fingerprinted
(:func:`pruning.calibration.data.fingerprints.calibration_fingerprints`, the function ``depthprune study``
fills new cells with); ``cells.json`` and ``study.json`` get the field, and the report prints, per study,
the yardstick items the draws share (none, or the command fails). A cell that already has a record is
checked against the draw made again: a difference fails, since the record would then not be the draw's.
Run from the repository root: a ``text:`` spec names its file relative to it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ground.core.files import write_text_atomically
from pruning.calibration.config import CalibrationConfig
from pruning.calibration.data.fingerprints import DrawFingerprints
from pruning.calibration.data.specs import spec_kind
from pruning.study.paths import resolved_path
from pruning.study.plan import instance_length


def cell_calibration(config: dict, cell: dict) -> CalibrationConfig:
    """The draw a manifest cell was calibrated on (the fields that decide which items are drawn)."""
    return CalibrationConfig(
        objective=cell["objective"],
        data=cell["data"],
        samples=config["samples"],
        seq_len=instance_length(spec_kind(cell["data"]), config["seq_len"], config.get("choice_seq_len")),
        seed=cell["data_seed"] if cell.get("data_seed") is not None else 0,
        sampling=config.get("sampling") or "documents",
    )


def fill(directory: Path, model: str | None = None) -> tuple[dict[str, dict], list[str]]:
    """``key -> calibration_items`` of every cell of ``directory/cells.json``, and the keys whose recorded
    field differs from the draw."""
    from transformers import AutoTokenizer

    manifest = json.loads((directory / "cells.json").read_text())
    drawn = DrawFingerprints(AutoTokenizer.from_pretrained(model or resolved_path(manifest["model"])))
    found, differing = {}, []
    for cell in manifest["cells"]:
        found[cell["key"]] = drawn(cell_calibration(manifest["config"], cell))
        if cell.get("calibration_items") not in (None, found[cell["key"]]):
            differing.append(cell["key"])
    return found, differing


def write(directory: Path, found: dict[str, dict]) -> None:
    """Put the records into ``cells.json`` and ``study.json`` (each file whole or not at all)."""
    for name in ("cells.json", "study.json"):
        path = directory / name
        if not path.is_file():
            continue
        text = path.read_text()
        record = json.loads(text)
        for cell in record["cells"]:
            cell["calibration_items"] = found[cell["key"]]
        second = text.splitlines()[1]
        indent = len(second) - len(second.lstrip(" "))  # the file's own
        write_text_atomically(
            path, json.dumps(record, indent=indent, default=str) + text[len(text.rstrip()) :]
        )


def main(argv: list[str] | None = None) -> int:
    from pruning.evaluation.yardstick import shared_with_yardstick

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("studies", nargs="+", type=Path, help="study report directories (with cells.json)")
    parser.add_argument("--model", help="the model whose tokenizer draws (default: the manifest's model)")
    parser.add_argument(
        "--write", action="store_true", help="write the records into cells.json and study.json"
    )
    args = parser.parse_args(argv)
    failed = False
    for directory in args.studies:
        found, differing = fill(directory, args.model)
        shared = {key: hit for key, items in found.items() if (hit := shared_with_yardstick(items))}
        units = sorted({items["unit"] for items in found.values()})
        print(
            f"{directory}: {len(found)} cells ({', '.join(units)}), {len(differing)} recorded differently, "
            f"{len(shared)} sharing an item with the yardstick"
        )
        failed |= bool(differing or shared)
        if args.write and not differing:
            write(directory, found)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
