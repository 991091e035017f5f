"""The ``heal`` pipeline: pruned variant → trained, merged checkpoint → a new variant whose parent it is.

``depthprune heal VARIANT --data pydoc --method lora --steps 200`` runs here:

1. :func:`plan_heal` checks everything before any weights load: the variant exists, is not ``dense``, has
   its checkpoint with the registered sha256, the LoRA rank fits the hidden size, the data is text with a
   training split apart from the held-out one (:mod:`pruning.healing.data`). A mistake is a one-line
   error, with nothing written and the registry unchanged.
2. The held-out loss of the parent is measured, adapters are put on (:mod:`pruning.healing.train`), the
   dense base model is loaded as the teacher for ``distill``, and the loop trains with its state under
   ``DEPTHPRUNE_HOME/runs/heal-<key>/``, the key a hash of the parent's weights and the run's settings.
3. The held-out loss is measured again, the adapters are merged and the checkpoint written
   (:mod:`pruning.healing.merge`) to ``OUT/<parent>-<method>-<key>``; then the healed variant is registered
   with its parent, and the run's state gives way to ``done.json``.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ground.core import settings as depthprune_settings
from ground.core.errors import UserError
from pruning.healing.config import HealConfig
from pruning.healing.data import HealingData, load_healing_data
from pruning.healing.state import DONE_FILE, RUN_FILE, STATE_FILE, TrainingState, run_directory, write_json
from pruning.model.checkpoint import PRUNING_FILE, PrunedCheckpoint
from registry.naming import DENSE, split_qualified
from registry.records import CHOICE_FIELDS, MEASUREMENT_FIELDS, VariantInfo, VariantRecord

PARENT_RECORD_FIELDS = (*CHOICE_FIELDS, *MEASUREMENT_FIELDS)
"""Fields of the parent's record that the healed variant carries unchanged (its removal and how it was
chosen)."""


@dataclass
class HealOutcome:
    """What ``heal`` reports (its ``--json`` line)."""

    id: int
    name: str
    checkpoint: str
    parent: str
    method: str
    steps: int
    wall_seconds: float
    losses: dict
    """``train`` (mean over the last tenth of the steps), ``train_first`` (the first step's),
    ``heldout`` and ``heldout_before`` (the parent's), mean next-token NLL on the held-out windows."""
    validation_loss: float | None = None
    """A patched child's loss on its parent's validation data under the parent's objective
    (``quality["validation_loss"]``, comparable with the parent's); None: not measured (a training method, or
    no ``assess_child``, or a parent with nothing to compare with)."""
    parent_validation_loss: float | None = None
    """The parent's validation loss (``prune``'s), beside ``validation_loss``."""
    fit: bool | None = None
    """The quality gate's verdict on the child, with its validation loss."""
    selected: bool | None = None
    """``prune --heal``: whether the child replaced its parent as the run's choice (a lower validation loss);
    None outside a prune run."""


@dataclass
class HealPlan:
    """Everything checked and derived before the weights load."""

    config: HealConfig
    parent: VariantInfo
    teacher: str
    """Directory (or hub id) of the dense base model: the teacher of ``distill``."""
    tokenizer: object
    data: HealingData
    settings: dict
    """:meth:`HealConfig.settings` with the data's facts: what decides the weights."""
    run_dir: Path
    out: Path
    """The healed checkpoint's directory."""

    @property
    def parent_dir(self) -> Path:
        return Path(self.parent.checkpoint_path)


def _resolve_parent(registry, config: HealConfig) -> VariantInfo:
    # `dense` (of any base model) is refused by name first: with several base models registered, resolving
    # it would fail as ambiguous, which hides the real mistake.
    dense_error = UserError(
        f"{config.variant!r} is the dense base model; heal a pruned variant (see `depthprune variants list`)"
    )
    if split_qualified(config.variant)[0] == DENSE:
        raise dense_error
    parent = registry.resolve(config.variant)
    if parent.is_dense:
        raise dense_error
    registry.verify_checkpoint(parent)
    if not (Path(parent.checkpoint_path) / PRUNING_FILE).is_file():
        raise UserError(f"checkpoint {parent.checkpoint_path} of {parent.name!r} has no {PRUNING_FILE}")
    return parent


def _check_patchable(parent: VariantInfo, model_config) -> None:
    """Refuse a patch that cannot be estimated or folded (before any weight loads)."""
    from pruning.healing.patch import EMBEDDING, check_foldable, removed_spans

    removed = PrunedCheckpoint.read(parent.checkpoint_path).removed_blocks
    if not removed:
        raise UserError(f"{parent.name!r} has no removed blocks: there is no span to patch")
    if parent.parent is not None:
        raise UserError(
            f"{parent.name!r} was healed already (from {parent.parent!r}); the patch is estimated on the "
            f"dense model's activations, which describe only unhealed blocks: patch {parent.parent!r} instead"
        )
    check_foldable(model_config.model_type)
    spans = removed_spans(removed)
    if getattr(model_config, "tie_word_embeddings", False) and all(s.before == EMBEDDING for s in spans):
        raise UserError(
            f"{parent.name!r} removes only leading blocks and ties its embeddings to the LM head: there is "
            "no untied weight before the span to carry the patch"
        )


def plan_heal(config: HealConfig, registry) -> HealPlan:
    """Check a run against the registry, the variant's config and the data; load no weights.

    Raises:
        UserError: an unknown or dense variant, a missing or modified checkpoint, a LoRA rank above the
            hidden size, data that is not text or whose training split is the held-out one, an output
            directory that is not a depthprune checkpoint.
    """
    from transformers import AutoTokenizer

    from pruning.model.blocks import load_config

    parent = _resolve_parent(registry, config)
    model_config = load_config(parent.checkpoint_path)
    if config.uses_lora and config.lora_rank > model_config.hidden_size:
        raise UserError(
            f"--lora-rank {config.lora_rank} is larger than the hidden size {model_config.hidden_size}"
        )
    if config.method == "last-blocks" and config.last_blocks > model_config.num_hidden_layers:
        raise UserError(
            f"--last-blocks {config.last_blocks} is more than the {model_config.num_hidden_layers} blocks "
            f"of {parent.name!r}"
        )
    if config.method == "patch":
        _check_patchable(parent, model_config)
    seq_len = min(config.seq_len, int(getattr(model_config, "max_position_embeddings", config.seq_len)))
    tokenizer = AutoTokenizer.from_pretrained(parent.checkpoint_path)
    data = load_healing_data(config, tokenizer, seq_len)
    settings = {**config.settings(seq_len), **data.facts()}
    identity = json.dumps({"parent": parent.checkpoint_sha256, "settings": settings}, sort_keys=True)
    key = hashlib.sha256(identity.encode()).hexdigest()[:16]
    out_root = Path(config.out).expanduser() if config.out else depthprune_settings.variants_dir()
    out = out_root / f"{parent.name}-{config.method}-{key[:8]}"
    if out.exists() and not (out / PRUNING_FILE).is_file():
        raise UserError(f"{out} exists and is not a depthprune checkpoint; move it or choose another --out")
    base = registry.get_base_model(parent.base_model)
    teacher = base.path or base.model
    return HealPlan(config, parent, teacher, tokenizer, data, settings, run_directory(key), out)


def _finished(plan: HealPlan) -> VariantRecord | None:
    """The record of an earlier run of the same plan whose checkpoint is still intact, else None."""
    from ground.core.checksums import weights_sha256

    done = plan.run_dir / DONE_FILE
    if not done.is_file() or not (plan.out / PRUNING_FILE).is_file():
        return None
    record = VariantRecord(**json.loads(done.read_text())["variant"])
    try:
        intact = weights_sha256(plan.out) == record.checkpoint_sha256
    except FileNotFoundError:
        intact = False
    return record if intact and record.checkpoint_path == str(plan.out.resolve()) else None


def _healing_record(plan: HealPlan, state: TrainingState, before: float, after: float) -> dict:
    last = state.losses[-max(1, len(state.losses) // 10) :]
    return {
        **plan.settings,
        "wall_seconds": round(state.wall_seconds, 3),
        "train_loss": sum(last) / len(last),
        "train_loss_first": state.losses[0],
        "heldout_loss": after,
        "parent_heldout_loss": before,
        "device": plan.config.device,
    }


def _train_and_write(plan: HealPlan) -> VariantRecord:
    """Train, merge and write the healed checkpoint of ``plan``; returns its record."""
    from pruning.healing.merge import merged_model, write_healed_checkpoint
    from pruning.healing.train import heldout_loss, train, trainable_model, underlying_causal_lm
    from pruning.model.blocks import load_model

    config = plan.config
    student, _ = load_model(
        plan.parent.checkpoint_path, dtype=config.dtype, device=config.device, gpus=config.gpus
    )
    before = heldout_loss(student, plan.data.heldout_windows, config.batch_size, config.device)
    model = trainable_model(student, config)
    teacher = None
    if config.method == "distill":
        teacher, _ = load_model(plan.teacher, dtype=config.dtype, device=config.device, gpus=config.gpus)
        teacher.requires_grad_(False)
    plan.run_dir.mkdir(parents=True, exist_ok=True)
    write_json(plan.run_dir / RUN_FILE, {"parent": plan.parent.name, "settings": plan.settings})
    try:
        state = train(model, teacher, plan.data, config, plan.run_dir)
    except KeyboardInterrupt:
        print(
            f"training state saved in {plan.run_dir}; run the same command again to resume", file=sys.stderr
        )
        raise
    after = heldout_loss(
        underlying_causal_lm(model), plan.data.heldout_windows, config.batch_size, config.device
    )
    record = VariantRecord(
        **{name: getattr(plan.parent, name) for name in PARENT_RECORD_FIELDS},
        parent=plan.parent.name,
        healing=_healing_record(plan, state, before, after),
    )
    written = write_healed_checkpoint(merged_model(model), plan.tokenizer, plan.parent_dir, plan.out, record)
    return written.variant


ChildAssessor = Callable[[object, object, VariantInfo, str], dict | None]
"""``assess(causal_lm, tokenizer, parent, model_id) -> quality record or None``: scores a patched child whole,
comparably with its parent (:func:`pruning.pipeline.heldout.repaired_quality`, which the command line passes;
the healing room does not import the pipeline's)."""


def _patch_and_write(plan: HealPlan, assess: ChildAssessor | None = None) -> VariantRecord:
    """Estimate the patch on the dense model, fold it into the parent's weights, score the child with
    ``assess`` (when given), write it."""
    import time

    import torch
    from tqdm import tqdm

    from pruning.healing.merge import write_healed_checkpoint
    from pruning.healing.patch import EMBEDDING, estimate_maps, fuse_map, is_tied, pick_windows, removed_spans
    from pruning.healing.train import heldout_loss
    from pruning.model.blocks import load_model

    config = plan.config
    checkpoint = PrunedCheckpoint.read(plan.parent_dir)
    spans = removed_spans(checkpoint.removed_blocks)
    windows = pick_windows(plan.data.train_windows, config.patch_samples, config.seed)
    started = time.perf_counter()
    dense, _ = load_model(plan.teacher, dtype=config.dtype, device=config.device, gpus=config.gpus)
    with tqdm(
        total=len(windows), desc="patch: dense activations", unit="window", disable=not config.progress
    ) as bar:
        statistics = gather_statistics_checked(dense, windows, spans, checkpoint.base_num_blocks, config, bar)
    tied = is_tied(dense)
    del dense
    maps = estimate_maps(statistics, config, config.device)
    estimated = time.perf_counter() - started
    student, _ = load_model(
        plan.parent.checkpoint_path, dtype=config.dtype, device=config.device, gpus=config.gpus
    )
    before = heldout_loss(student, plan.data.heldout_windows, config.batch_size, config.device)
    started = time.perf_counter()
    patched, unpatched = [], []
    for span, transform, stats in zip(spans, maps, statistics, strict=True):
        if span.before == EMBEDDING and tied:
            unpatched.append({"span": span.as_list(), "reason": "leading span with tied embeddings"})
            continue
        identity = torch.eye(transform.shape[0], dtype=torch.float64)
        patched.append(
            {
                "span": span.as_list(),
                "weight": fuse_map(student, checkpoint.kept_to_original, span, transform),
                "relative_error": stats.squared_error(transform) / max(stats.squared_error(identity), 1e-300),
            }
        )
    wall_seconds = estimated + time.perf_counter() - started
    after = heldout_loss(student, plan.data.heldout_windows, config.batch_size, config.device)
    healing = {
        **plan.settings,
        "calibration_windows": len(windows),
        "calibration_tokens": sum(len(window) for window in windows),
        "spans": patched,
        "unpatched_spans": unpatched,
        "wall_seconds": round(wall_seconds, 3),
        "heldout_loss": after,
        "parent_heldout_loss": before,
        "device": config.device,
    }
    record = VariantRecord(
        **{name: getattr(plan.parent, name) for name in PARENT_RECORD_FIELDS},
        parent=plan.parent.name,
        healing=healing,
        quality=None if assess is None else assess(student, plan.tokenizer, plan.parent, str(plan.out)),
    )
    plan.run_dir.mkdir(parents=True, exist_ok=True)
    return write_healed_checkpoint(student, plan.tokenizer, plan.parent_dir, plan.out, record).variant


def gather_statistics_checked(dense, windows, spans, base_num_blocks: int, config: HealConfig, bar):
    """:func:`pruning.healing.patch.gather_statistics`, checking the base model's depth."""
    from pruning.healing.patch import gather_statistics

    blocks = dense.config.num_hidden_layers
    if blocks != base_num_blocks:
        raise UserError(
            f"the base model has {blocks} blocks, but the variant was pruned from {base_num_blocks}"
        )
    return gather_statistics(dense, windows, spans, config, bar.update)


def _assessed(plan: HealPlan, record: VariantRecord, assess: ChildAssessor | None) -> VariantRecord:
    """A finished patch run's record, scored with ``assess`` when it was written without a quality record."""
    if assess is None or record.quality is not None or plan.config.method != "patch":
        return record
    from pruning.model.blocks import load_model

    config = plan.config
    child, _ = load_model(str(plan.out), dtype=config.dtype, device=config.device, gpus=config.gpus)
    quality = assess(child, plan.tokenizer, plan.parent, str(plan.out))
    return record if quality is None else dataclasses.replace(record, quality=quality)


def heal(config: HealConfig, assess_child: ChildAssessor | None = None) -> HealOutcome:
    """Run ``config``: train the variant, write the healed checkpoint, register it as the variant's child.

    Interrupted runs resume: run the same command again and training continues from the last saved step
    to the same weights. A run that finished is not repeated: its checkpoint is registered again.

    Args:
        config: the run.
        assess_child: ``patch`` only: scores the child whole on its parent's validation data before it is
            written, so that its record carries a ``quality`` comparable with the parent's (the command line
            passes :func:`pruning.pipeline.heldout.repaired_quality`); None: no quality record.

    Returns:
        The registered healed variant and its losses.
    """
    from registry import open_registry

    with open_registry(config.registry_url) as registry:
        plan = plan_heal(config, registry)
        if config.method == "patch":
            write = functools.partial(_patch_and_write, assess=assess_child)
        else:
            write = _train_and_write
        record = _finished(plan)
        record = write(plan) if record is None else _assessed(plan, record, assess_child)
        variant = registry.register_variant(record)
    write_json(plan.run_dir / DONE_FILE, {"variant": dataclasses.asdict(record)})
    (plan.run_dir / STATE_FILE).unlink(missing_ok=True)  # the checkpoint holds the result now
    healing = record.healing
    return HealOutcome(
        id=variant.id,
        name=variant.name,
        checkpoint=record.checkpoint_path,
        parent=plan.parent.name,
        method=config.method,
        steps=healing["steps"],
        wall_seconds=healing["wall_seconds"],
        losses={
            "train": healing.get("train_loss"),
            "train_first": healing.get("train_loss_first"),
            "heldout": healing["heldout_loss"],
            "heldout_before": healing["parent_heldout_loss"],
        },
        validation_loss=(record.quality or {}).get("validation_loss"),
        parent_validation_loss=(record.quality or {}).get("parent_validation_loss"),
        fit=(record.quality or {}).get("fit"),
    )
