"""Exporting the registry: every variant with its evaluations and serving benchmarks, as JSON or CSV.

JSON keeps everything (``depthprune variants export --out registry.json``); CSV has one row per
variant (the dense models included) with one column per evaluation (``suite/task/metric``) and the
latest serving benchmark's metrics (``serve:median_ttft_ms``, ...), for spreadsheets and plots. A healed
variant's row names its ``parent`` and carries its ``healing`` record: the main fields in ``healing:method``,
``healing:steps``, ``healing:heldout_loss``, ... and the whole record as JSON in ``healing``.
"""

from __future__ import annotations

import csv
import io
import json
from datetime import datetime, timezone
from typing import Any

from registry.api import Registry
from registry.compare import evaluation_key
from registry.database import display_url

FORMATS = ("json", "csv")
CSV_VARIANT_COLUMNS = (
    "id", "name", "base_model", "is_dense", "num_blocks", "num_removed", "removed_blocks", "objective",
    "search", "calibration_loss", "dense_loss", "search_seconds", "block_forwards", "subset_evaluations",
    "checkpoint_path", "checkpoint_sha256", "aliases", "created_at",
)  # fmt: skip
CSV_CALIBRATION_COLUMNS = ("data", "samples", "seq_len", "seed")
CSV_LINEAGE_COLUMNS = ("parent", "parent_id")
"""A healed variant's parent (empty for pruned variants and dense models)."""
CSV_HEALING_COLUMNS = (
    "method", "data", "steps", "seed", "train_loss", "heldout_loss", "parent_heldout_loss", "wall_seconds",
)  # fmt: skip
"""Fields of a healed variant's ``healing`` record, as ``healing:<field>`` columns; the whole record (the
hyper-parameters included) is in the ``healing`` column as JSON."""


def export_document(
    registry: Registry, base_model: str | None = None, *, progress: bool = False
) -> dict[str, Any]:
    """Everything the registry holds (about one base model, if given), JSON-ready.

    Args:
        registry: the open registry.
        base_model: only this base model and its variants.
        progress: show a progress bar on stderr (a large registry takes a while).

    Returns:
        ``{"registry", "exported_at", "base_models": [...], "variants": [{..., "evaluations": [...],
        "serving_benchmarks": [...]}]}``; dense models are listed as variants with ``is_dense``.
    """
    bases = [registry.get_base_model(base_model)] if base_model else registry.base_models()
    variants = []
    from tqdm import tqdm

    listed = registry.list_variants(base_model, include_dense=True)
    disable = None if progress else True  # None: tqdm draws the bar only when stderr is a terminal
    for variant in tqdm(listed, desc="exporting", unit="variant", disable=disable, leave=False):
        entry = variant.to_dict()
        entry["evaluations"] = [item.to_dict() for item in registry.evaluations(variant)]
        entry["serving_benchmarks"] = [item.to_dict() for item in registry.serving_benchmarks(variant)]
        variants.append(entry)
    return {
        "registry": display_url(registry.url),
        "exported_at": datetime.now(timezone.utc).isoformat(),
        "base_models": [base.to_dict() for base in bases],
        "variants": variants,
    }


def _cell(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return " ".join(map(str, value))
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True)
    return "" if value is None else value


def export_csv(document: dict[str, Any]) -> str:
    """The CSV text of an :func:`export_document`: one row per variant."""
    evaluation_keys = sorted(
        {
            evaluation_key(item["suite"], item["task"], item["metric"])
            for variant in document["variants"]
            for item in variant["evaluations"]
        }
    )
    serve_keys = sorted(
        {
            key
            for variant in document["variants"]
            for key in (variant["serving_benchmarks"][0]["metrics"] if variant["serving_benchmarks"] else {})
        }
    )
    header = [
        *CSV_VARIANT_COLUMNS,
        *CSV_CALIBRATION_COLUMNS,
        *CSV_LINEAGE_COLUMNS,
        *(f"healing:{column}" for column in CSV_HEALING_COLUMNS),
        "healing",
        *evaluation_keys,
        *(f"serve:{key}" for key in serve_keys),
    ]
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(header)
    for variant in document["variants"]:
        evaluations = {
            evaluation_key(item["suite"], item["task"], item["metric"]): item["value"]
            for item in variant["evaluations"]
        }
        latest = variant["serving_benchmarks"][0]["metrics"] if variant["serving_benchmarks"] else {}
        healing = variant.get("healing") or {}
        writer.writerow(
            [
                *(_cell(variant.get(column)) for column in CSV_VARIANT_COLUMNS),
                *(_cell(variant["calibration"].get(column)) for column in CSV_CALIBRATION_COLUMNS),
                *(_cell(variant.get(column)) for column in CSV_LINEAGE_COLUMNS),
                *(_cell(healing.get(column)) for column in CSV_HEALING_COLUMNS),
                _cell(variant.get("healing")),
                *(_cell(evaluations.get(key)) for key in evaluation_keys),
                *(_cell(latest.get(key)) for key in serve_keys),
            ]
        )
    return buffer.getvalue()


def render_export(document: dict[str, Any], export_format: str) -> str:
    """The export as text in ``json`` or ``csv``."""
    if export_format == "csv":
        return export_csv(document)
    return json.dumps(document, indent=2, default=str) + "\n"
