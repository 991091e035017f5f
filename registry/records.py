"""The registry's records: what goes in (:class:`VariantRecord`) and what comes out (the ``...Info`` classes).

:class:`VariantRecord` is the one description of a pruned variant: ``prune`` builds it,
:meth:`registry.api.Registry.register_variant` stores it, and ``pruning.json`` next to the checkpoint
carries it (``dataclasses.asdict``). The pruning side imports it from here; the registry never imports
pruning. A *healed* variant (``depthprune heal``) is a record like its parent's, removal and calibration
included, plus ``parent`` (the pruned variant it was trained from) and ``healing`` (how, and how well).

What the registry API returns are plain dataclasses, detached from the database session. Every one has
``to_dict()`` giving JSON-ready values (timestamps as ISO 8601 strings), which is what
``depthprune variants ... --json`` and ``variants export`` print.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from ground.core.errors import UserError
from registry.naming import (
    DENSE,
    block_indices,
    block_mask,
    check_name,
    json_dict,
    optional_count,
    optional_float,
    required_text,
)

HEALING_MEASUREMENTS = (
    "wall_seconds",
    "train_loss",
    "train_loss_first",
    "heldout_loss",
    "parent_heldout_loss",
    "device",
)
"""Keys of a healing record that say how a run went, not what it was asked to do: left out of the
variant's identity, so that healing again with the same settings updates the same variant."""


CHOICE_FIELDS = ("base_model", "removed_blocks", "calibration", "search", "search_options")
"""The :class:`VariantRecord` fields that say which blocks were removed and how they were chosen (a healed
variant carries its parent's unchanged)."""
MEASUREMENT_FIELDS = (
    "calibration_loss",
    "dense_loss",
    "search_seconds",
    "block_forwards",
    "subset_evaluations",
)
"""The :class:`VariantRecord` fields that measure the search (``pruning.json``'s ``scores`` repeats them);
:class:`VariantInfo` has each with the same type."""


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
class VariantRecord:
    """A pruned variant as pruning produced it: what the registry stores and ``pruning.json`` carries.

    Four fields are its identity in the registry: ``base_model``, ``removed_blocks``, ``calibration`` and
    ``search``; registering a record with the same four again updates that variant. ``__post_init__``
    checks every field and turns it into plain JSON values (numpy scalars become Python numbers, a NaN
    loss becomes None, the removed blocks are sorted), so ``dataclasses.asdict(record)`` can be written as
    JSON and read back with ``VariantRecord(**fields)``. What only the registry can check, that the base
    model is registered and the removed blocks fit its block count, is checked when it is registered.

    Raises:
        UserError: on a field the registry would refuse.
    """

    base_model: str
    """Hub id or local directory of the dense model; registered with ``register_base_model`` first."""
    removed_blocks: list[int]
    """Original indices of the removed blocks, sorted."""
    calibration: dict
    """``dataclasses.asdict`` of the calibration configuration that chose them; names its ``objective``."""
    search: str
    """Search algorithm name (a key of ``pruning.search.SEARCHES``, or ``manual`` for a hand-chosen set)."""
    search_options: dict = field(default_factory=dict)
    """The algorithm's settings as used (``prune`` adds the ``seed`` it ran with)."""
    calibration_loss: float | None = None
    """Calibration loss of the variant; None when not measured."""
    dense_loss: float | None = None
    """Calibration loss of the dense model under the same configuration; None when not measured."""
    search_seconds: float | None = None
    """Wall time of the search, in seconds."""
    block_forwards: int | None = None
    """Decoder-block forwards the evaluator ran during the search."""
    subset_evaluations: int | None = None
    """Distinct removal sets the search scored."""
    checkpoint_path: str | None = None
    """Directory of the pruned checkpoint (made absolute); None when none was written. Registering again
    with None keeps the checkpoint already recorded."""
    checkpoint_sha256: str | None = None
    """:func:`ground.core.checksums.weights_sha256` of that checkpoint, checked before serving."""
    name: str | None = None
    """Name to register it under; None generates one (``llama-3-8b-ppl-greedy-m7-1a2b3c``, or the parent's
    name plus method and hash for a healed variant) or, when registering again, keeps the recorded one."""
    parent: str | None = None
    """For a healed variant: the registry name of the pruned variant it was trained from (same base model
    and removed blocks); None for a variant that pruning produced."""
    healing: dict | None = None
    """For a healed variant: how it was trained from ``parent`` (``depthprune heal``): ``method``
    (``lora`` or ``distill``), ``data`` and the splits used, ``steps``, ``seed``, ``hyperparameters``, and
    the measurements :data:`HEALING_MEASUREMENTS` (wall time, final training and held-out loss, the
    parent's held-out loss). None exactly when ``parent`` is None."""

    quality: dict | None = None
    """The quality gate's record (``prune``): ``fit`` (the verdict), ``validation_loss`` and
    ``validation_data``, ``perplexity`` and ``dense_perplexity`` on held-out text, ``max_ppl_ratio`` (K),
    ``accuracy`` and ``chance`` (multiple-choice objectives), ``reasons`` (why unfit). None: not measured."""

    def __post_init__(self) -> None:
        self.base_model = required_text(self.base_model, "base_model")
        self.removed_blocks = block_indices(self.removed_blocks)
        self.calibration = json_dict(self.calibration, "calibration")
        if self.quality is not None:
            self.quality = json_dict(self.quality, "quality")
        objective = self.calibration.get("objective")
        if not isinstance(objective, str) or not objective:
            raise UserError(
                f"calibration must name its objective (calibration['objective']), got {self.calibration!r}"
            )
        self.search = required_text(self.search, "search")
        self.search_options = json_dict(self.search_options, "search_options")
        for what in ("calibration_loss", "dense_loss", "search_seconds"):
            setattr(self, what, optional_float(getattr(self, what), what))
        for what in ("block_forwards", "subset_evaluations"):
            setattr(self, what, optional_count(getattr(self, what), what))
        if self.checkpoint_path is not None:
            self.checkpoint_path = str(Path(self.checkpoint_path).expanduser().resolve())
        if self.checkpoint_sha256 is not None:
            self.checkpoint_sha256 = required_text(self.checkpoint_sha256, "checkpoint_sha256")
        if self.name is not None:
            check_name(self.name, "variant name")
        self._check_lineage()

    def _check_lineage(self) -> None:
        if (self.parent is None) != (self.healing is None):
            raise UserError("a healed variant names both its parent and its healing record, or neither")
        if self.parent is None:
            return
        self.parent = required_text(self.parent, "parent")
        self.healing = json_dict(self.healing, "healing")
        if not isinstance(self.healing.get("method"), str) or not self.healing["method"]:
            raise UserError(f"the healing record must name its method, got {self.healing!r}")

    @property
    def objective(self) -> str:
        """The calibration objective (``ppl``, ``task_margin``, ...)."""
        return self.calibration["objective"]

    def healing_settings(self) -> dict | None:
        """What the healing run was asked to do: the healing record without its measurements."""
        if self.healing is None:
            return None
        return {key: value for key, value in self.healing.items() if key not in HEALING_MEASUREMENTS}


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
    """:func:`ground.core.checksums.weights_sha256` of the weights the variants were pruned from."""
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
    model_files: dict | None = None
    """``{file name: sha256}`` of the files of ``path`` that define the model (weights, config, tokenizer,
    generation config, chat template), taken at registration; None without a local directory."""


@dataclass
class VariantInfo(_Record):
    """A pruned variant (healed ones name their ``parent``), or the dense base model itself (``is_dense``,
    no removed blocks)."""

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
    """Weights checksum of that checkpoint (checked before serving when there is no ``checkpoint_files``)."""
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
    parent: str | None = None
    """For a healed variant: the name of the variant it was trained from (None also once that is removed)."""
    parent_id: int | None = None
    """Registry id of ``parent``."""
    healing: dict | None = None
    """For a healed variant: how it was trained from its parent (see :attr:`VariantRecord.healing`)."""
    checkpoint_files: dict | None = None
    """``{file name: sha256}`` of the checkpoint's files that define the model (weights, config, tokenizer,
    generation config, chat template; :mod:`registry.integrity`), taken at registration and checked before
    every start of a backend; for ``dense``, the base model's. None when registered without a local
    directory, or before manifests existed."""
    quality: dict | None = None
    """What the quality gate measured (see :attr:`VariantRecord.quality`); None when not measured."""
    fit: bool | None = None
    """The quality gate's verdict: False = unfit (``serve`` refuses it without ``--allow-unfit``); None = not
    measured (registered before the gate); the dense model is fit."""

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
