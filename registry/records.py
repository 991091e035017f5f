"""What the registry API returns: plain dataclasses, detached from the database session.

Every record has ``to_dict()`` giving JSON-ready values (timestamps as ISO 8601 strings), which is
what ``depthprune variants ... --json`` and ``variants export`` print.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from registry.naming import DENSE, block_mask


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {key: _jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(item) for item in value]
    return value


class _Record:
    def to_dict(self) -> dict[str, Any]:
        """The fields as JSON-ready values."""
        return {item.name: _jsonable(getattr(self, item.name)) for item in dataclasses.fields(self)}


@dataclass
class BaseModelInfo(_Record):
    """A dense model that variants were pruned from."""

    id: int
    """Registry id."""
    model: str
    """Hub id, or the absolute path of a local directory."""
    revision: str | None
    """Hub revision, when one was given."""
    weights_sha256: str
    """:func:`depthprune.checksums.weights_sha256` of the weights the variants were pruned from."""
    num_blocks: int
    """N, the number of decoder blocks."""
    architecture: str
    """``config.model_type`` (llama, qwen3, ...)."""
    path: str | None
    """Local directory of the weights, when known (what ``dense`` serves)."""
    created_at: datetime
    """When first registered (UTC)."""
    updated_at: datetime
    """When last registered (UTC)."""


@dataclass
class VariantInfo(_Record):
    """A pruned variant, or the dense base model itself (``is_dense``, no removed blocks)."""

    id: int | None
    """Registry id; ``None`` for the dense model, which has no variant row."""
    name: str
    """Unique name, served as the vLLM ``--served-model-name``; ``dense`` for the base model."""
    base_model: str
    """Hub id or path of the base model."""
    base_revision: str | None
    """Hub revision of the base model."""
    num_blocks: int
    """N, the number of blocks of the base model."""
    architecture: str
    """``config.model_type`` of the base model."""
    removed_blocks: list[int]
    """Original indices of the removed blocks, sorted."""
    kept_to_original: list[int]
    """``kept_to_original[new_index]`` is the original index of each remaining block."""
    calibration: dict
    """The calibration configuration (objective, data, samples, seq_len, seed)."""
    search: str
    """Search algorithm name (``dense`` for the base model)."""
    search_options: dict
    """The algorithm's settings as used."""
    calibration_loss: float | None
    """Calibration loss of the variant."""
    dense_loss: float | None
    """Calibration loss of the dense model under the same configuration."""
    search_seconds: float | None
    """Wall time of the search."""
    block_forwards: int | None
    """Decoder-block forwards the evaluator ran during the search."""
    subset_evaluations: int | None
    """Distinct removal sets the evaluator scored."""
    checkpoint_path: str | None
    """Directory of the pruned checkpoint (for ``dense``: the base model's directory or hub id)."""
    checkpoint_sha256: str | None
    """Weights checksum of that checkpoint, checked before serving."""
    created_at: datetime
    """When first registered (UTC)."""
    versions: dict
    """Tool versions that produced the row."""
    aliases: list[str] = field(default_factory=list)
    """Aliases that point at this variant."""
    is_dense: bool = False
    """True for the base model itself."""
    base_weights_sha256: str | None = None
    """Weights checksum of the base model this variant was pruned from."""
    updated_at: datetime | None = None
    """When last registered (UTC)."""

    @property
    def objective(self) -> str | None:
        """The calibration objective (``ppl``, ``task_margin``, ...); ``None`` for the dense model."""
        return self.calibration.get("objective")

    @property
    def num_removed(self) -> int:
        """M, the number of removed blocks."""
        return len(self.removed_blocks)

    @property
    def qualified_name(self) -> str:
        """``dense@BASE`` for a dense model (unambiguous with several base models), else the name."""
        return f"{DENSE}@{self.base_model}" if self.is_dense else self.name

    def mask(self, kept: str = "■", dropped: str = "□") -> str:
        """One character per original block: ``■`` kept, ``□`` removed."""
        return block_mask(self.removed_blocks, self.num_blocks, kept, dropped)

    def to_dict(self) -> dict[str, Any]:
        """The fields plus ``objective`` and ``num_removed``, JSON-ready."""
        return {**super().to_dict(), "objective": self.objective, "num_removed": self.num_removed}


@dataclass
class EvaluationInfo(_Record):
    """One metric of one task, measured on a variant (or the dense model)."""

    id: int
    """Registry id."""
    variant: str
    """Variant name (``dense`` for the base model)."""
    variant_id: int | None
    """Variant id; ``None`` for the base model."""
    base_model: str
    """Base model of the variant."""
    suite: str
    """Which harness: ``ppl``, ``lm-eval``, ..."""
    task: str
    """Task or data set: ``wikitext2``, ``piqa``, ..."""
    metric: str
    """Metric name: ``perplexity``, ``acc``, ``acc_norm``, ..."""
    value: float
    """The measured value."""
    settings: dict
    """How it was measured (samples, sequence length, few-shot, seed, ...)."""
    versions: dict
    """Tool versions of the measurement."""
    created_at: datetime
    """When measured (UTC)."""


@dataclass
class ServingBenchmarkInfo(_Record):
    """One load-test run against a served variant (or the dense model)."""

    id: int
    """Registry id."""
    variant: str
    """Variant name (``dense`` for the base model)."""
    variant_id: int | None
    """Variant id; ``None`` for the base model."""
    base_model: str
    """Base model of the variant."""
    settings: dict
    """Load settings: request rate, concurrency, prompt/output lengths, number of prompts, ..."""
    metrics: dict
    """Results under ``vllm bench serve`` key names (``median_ttft_ms``, ``output_throughput``, ...)."""
    hardware: str
    """Where it ran."""
    versions: dict
    """Tool versions of the run."""
    created_at: datetime
    """When it ran (UTC)."""
