"""The healed checkpoint: adapters merged into the weights, written as an ordinary HF checkpoint, atomically.

``peft``'s ``merge_and_unload`` folds each LoRA update ``(alpha / r) B A`` into its linear layer, so the
result has exactly the parent's modules and shapes: transformers and vLLM load it as they load the parent.
It is saved in the parent's own dtype next to its tokenizer and generation config. ``pruning.json`` is the
parent's (base model, removed blocks, kept-to-original map, calibration, scores) with this checkpoint's
path and weights sha256, and under ``variant`` the healed variant's record: the parent's removal record
plus ``parent`` and ``healing``. The directory is built under a temporary name and renamed into place
(:func:`pruning.model.checkpoint.staged_directory`).
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import asdict, replace
from functools import partial
from pathlib import Path

from ground.core.checksums import weights_sha256
from ground.core.version import __version__
from pruning.model.blocks import load_config
from pruning.model.checkpoint import PRUNING_FILE, PrunedCheckpoint, model_card, staged_directory
from pruning.model.disk_space import checkpoint_bytes, full_disk_as_user_error
from registry.records import VariantRecord


def merged_model(model):
    """The plain transformers model with the LoRA adapters folded into its weights (``model`` itself when
    it has none, after a full fine-tune)."""
    from peft import PeftModel

    if isinstance(model, PeftModel):
        return model.merge_and_unload()
    return model


def saved_dtype(checkpoint_dir: Path):
    """The torch dtype a checkpoint's config declares (float32 when it declares none)."""
    import torch

    config = load_config(str(checkpoint_dir))
    declared = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(declared, str):
        declared = getattr(torch, declared, None)
    return declared if isinstance(declared, torch.dtype) else torch.float32


def healed_model_card(checkpoint: PrunedCheckpoint) -> str:
    """The parent's model card with a paragraph on the healing."""
    healing = checkpoint.variant.healing
    if healing["method"] == "patch":
        settings = healing["hyperparameters"]
        return model_card(checkpoint) + (
            f"\n## Repair\n\nRepaired without training from the pruned variant "
            f"`{checkpoint.variant.parent}`: "
            f"one linear map per removed span (ReplaceMe, `{settings['estimator']}` estimator) estimated on "
            f"{healing['calibration_tokens']} tokens of `{healing['data']}` ({healing['train_split']} split) "
            f"and folded into the weights that feed each span's place, so the model has its parent's shape. "
            f"Held-out loss {healing.get('parent_heldout_loss')} before, "
            f"{healing.get('heldout_loss')} after. "
            f"See `variant.healing` in `{PRUNING_FILE}` for every setting.\n"
        )
    return model_card(checkpoint) + (
        f"\n## Healing\n\nTrained from the pruned variant `{checkpoint.variant.parent}` with "
        f"`{healing['method']}` for {healing['steps']} steps on `{healing['data']}` "
        f"({healing['train_split']} split), seed {healing['seed']}; held-out loss "
        f"{healing.get('parent_heldout_loss')} before, {healing.get('heldout_loss')} after. The adapters "
        f"are merged into the weights. See `variant.healing` in `{PRUNING_FILE}` for every setting.\n"
    )


def write_healed_checkpoint(
    causal_lm, tokenizer, parent_dir: Path, out: Path, record: VariantRecord
) -> PrunedCheckpoint:
    """Write the healed model to ``out`` (replacing a previous healed checkpoint there).

    Args:
        causal_lm: the merged model (:func:`merged_model`).
        tokenizer: the parent's tokenizer.
        parent_dir: the parent variant's checkpoint (its ``pruning.json`` and dtype are carried over).
        out: the directory to create.
        record: the healed variant's record; its checkpoint path and sha256 are filled in here.

    Returns:
        What ``out/pruning.json`` holds.
    """
    parent = PrunedCheckpoint.read(parent_dir)
    causal_lm.to(saved_dtype(parent_dir))
    needed_bytes = partial(checkpoint_bytes, causal_lm, parent_dir)  # counted only on a full disk
    with full_disk_as_user_error(out, needed_bytes=needed_bytes), staged_directory(out) as staging:
        causal_lm.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        path, sha256 = str(out.resolve()), weights_sha256(staging)
        checkpoint = replace(
            parent,
            path=path,
            weights_sha256=sha256,
            created_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            depthprune_version=__version__,
            variant=replace(record, checkpoint_path=path, checkpoint_sha256=sha256),
        )
        (staging / PRUNING_FILE).write_text(json.dumps(asdict(checkpoint), indent=2) + "\n")
        (staging / "README.md").write_text(healed_model_card(checkpoint))
    return checkpoint
