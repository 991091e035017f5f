"""Write a depth-pruned variant as an ordinary Hugging Face checkpoint.

The kept blocks are renumbered 0..N-M-1, ``num_hidden_layers`` is updated and every per-layer config
list is sliced by the kept *original* indices, so transformers and vLLM load the variant unchanged. Next
to the weights go the tokenizer, the generation config, ``pruning.json`` (what was removed from which
base model, and why) and a model card. Parity rule: the variant's logits equal the dense model run with
those blocks skipped (``pruning.model.blocks.BlockStack.forward``).

The directory is built under a temporary name beside ``out`` and renamed into place at the end
(:func:`staged_directory`), so a failure or Ctrl-C never leaves a half-written checkpoint behind.

**pruning.json** is :class:`PrunedCheckpoint` as ``dataclasses.asdict``. Its top-level keys describe the
checkpoint (``base_model``, ``base_num_blocks``, ``removed_blocks``, ``kept_to_original``, the weight
hashes, ...) and are read as they are by the load test and the demo. The registry's record of the
variant is under ``variant``: a :class:`registry.records.VariantRecord` as ``dataclasses.asdict``, with
this checkpoint's path and sha256, the same record ``prune`` registers; ``null`` when no calibration
objective chose the blocks (``depthprune checkpoint``). ``calibration`` and ``scores`` repeat the
record's calibration and measurements under the names files written before the record had; reading such
an older file rebuilds its ``variant`` from them.

Command: ``depthprune checkpoint --model PATH_OR_ID --remove 3,7,8 --out DIR``.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path

from ground.core.checksums import (
    WEIGHTS_RELEASED,
    has_weight_files,
    released_weights,
    weight_files,
    weights_sha256,
)
from ground.core.errors import UserError
from ground.core.files import write_text_atomically
from pruning.model.blocks import load_config, resolve, validate_removed
from pruning.model.disk_space import checkpoint_bytes, full_disk_as_user_error
from pruning.model.sources import GgufSource
from registry.records import MEASUREMENT_FIELDS, VariantRecord

PRUNING_FILE = "pruning.json"
MANUAL_SEARCH = "manual"
"""The ``search`` of a variant whose blocks were chosen by hand under a named calibration."""


@dataclass
class PrunedCheckpoint:
    """What was written, as recorded in ``pruning.json``."""

    path: str
    """The checkpoint directory."""
    base_model: str
    """Hub id or local directory of the dense model."""
    base_revision: str | None
    """Hub revision (commit) of the base model; None for a local directory."""
    base_weights_sha256: str
    """sha256 of the base model's weight files (:func:`ground.core.checksums.weights_sha256`)."""
    architecture: str
    """transformers ``model_type`` of the base model."""
    base_num_blocks: int
    """N, the number of decoder blocks of the base model."""
    removed_blocks: list[int]
    """Original indices of the removed blocks, sorted."""
    kept_to_original: list[int]
    """``kept_to_original[i]`` is the original index of the variant's block ``i``."""
    weights_sha256: str
    """sha256 of the variant's own weight files."""
    calibration: dict | None = None
    """The calibration configuration that chose the removed blocks, if any."""
    scores: dict = field(default_factory=dict)
    """Losses and search statistics that came with the choice."""
    created_at: str = ""
    """UTC time the checkpoint was written, ISO 8601."""
    depthprune_version: str = ""
    """Version of depthprune that wrote it."""
    variant: VariantRecord | None = None
    """The registry's record of the variant, with this checkpoint's path and sha256; None when no
    calibration objective chose the removed blocks."""
    base_source: GgufSource | None = None
    """The GGUF file the base model was converted from (path, sha256, size, architecture, name); None
    when the base model is a Hugging Face checkpoint or hub id."""

    @classmethod
    def read(cls, directory: str | Path) -> PrunedCheckpoint:
        """Read ``pruning.json`` of a variant directory (also one written before it had ``variant``)."""
        path = Path(directory) / PRUNING_FILE
        if not path.is_file():
            raise UserError(f"{directory} is not a depthprune variant (no {PRUNING_FILE})")
        fields = json.loads(path.read_text())
        if "variant" not in fields:  # written before the record was: rebuild it from what it has
            fields["variant"] = variant_from_scores(
                fields["base_model"],
                fields["removed_blocks"],
                fields.get("calibration"),
                fields.get("scores"),
            )
            if fields["variant"] is not None:
                fields["variant"] = replace(
                    fields["variant"],
                    checkpoint_path=fields["path"],
                    checkpoint_sha256=fields["weights_sha256"],
                )
        elif fields["variant"] is not None:
            fields["variant"] = VariantRecord(**fields["variant"])
        if fields.get("base_source") is not None:
            fields["base_source"] = GgufSource(**fields["base_source"])
        return cls(**fields)


def variant_from_scores(
    base_model: str, removed_blocks: list[int], calibration: dict | None, scores: dict | None
) -> VariantRecord | None:
    """The record of a variant described by a calibration and ``scores`` (older ``pruning.json`` files).

    Returns:
        None when ``calibration`` names no objective (blocks chosen by hand: nothing to file it under);
        else a record whose search is ``scores["search"]``, or ``manual`` when it names none.
    """
    if not (calibration or {}).get("objective"):
        return None
    scores = scores or {}
    options = dict(scores.get("search_options") or {})
    if scores.get("seed") is not None:
        options.setdefault("seed", scores["seed"])  # prune registers the seed among the options
    return VariantRecord(
        base_model=base_model,
        removed_blocks=list(removed_blocks),
        calibration=calibration,
        search=scores.get("search", MANUAL_SEARCH),
        search_options=options,
        **{name: scores.get(name) for name in MEASUREMENT_FIELDS},
    )


def scores_of(variant: VariantRecord) -> dict:
    """``scores`` of ``pruning.json``: the record's search and measurements, its seed on its own."""
    options = dict(variant.search_options)
    seed = options.pop("seed", None)
    return {
        "calibration_loss": variant.calibration_loss,
        "dense_loss": variant.dense_loss,
        "search": variant.search,
        "search_options": options,
        "seed": seed,
        "search_seconds": variant.search_seconds,
        "block_forwards": variant.block_forwards,
        "subset_evaluations": variant.subset_evaluations,
    }


def resolve_model_dir(model: str, revision: str | None = None) -> tuple[Path, str | None]:
    """Local directory of a model given as a directory, a hub id, a GGUF file or an embedded name, and its
    hub revision.

    Hub ids go through the Hugging Face cache (``snapshot_download``), so the weights we hash are the
    ones transformers loads; a GGUF file is its converted checkpoint (:mod:`pruning.model.sources`).
    """
    resolved = resolve(model, revision)
    path = Path(resolved.model).expanduser()
    if resolved.source is not None:
        return path, None
    if path.is_dir():
        return path, revision
    if path.exists() or model.startswith((".", "/", "~")):
        raise UserError(f"{model!r} is not a model directory")
    from huggingface_hub import snapshot_download

    try:
        snapshot = Path(snapshot_download(model, revision=revision))
    except Exception as error:  # offline, unknown repo, gated model: all the user's to fix
        raise UserError(f"cannot fetch {model!r} from the hub: {str(error).splitlines()[0]}") from None
    return snapshot, snapshot.name


def slice_per_layer_config(config, kept_to_original: list[int]) -> None:
    """Update ``config`` in place for a model that keeps only ``kept_to_original`` blocks.

    Every list attribute with one entry per block (``layer_types`` and the like) is sliced by the kept
    original indices. ``max_window_layers`` (Qwen2/Qwen3: blocks below it use full attention) is an
    index threshold, not a list, so it becomes the number of kept blocks that were below it.
    """
    num_blocks = config.num_hidden_layers
    for name, value in list(vars(config).items()):
        if isinstance(value, (list, tuple)) and len(value) == num_blocks and not name.startswith("_"):
            setattr(config, name, type(value)(value[i] for i in kept_to_original))
    if isinstance(getattr(config, "max_window_layers", None), int):
        config.max_window_layers = sum(1 for i in kept_to_original if i < config.max_window_layers)
    config.num_hidden_layers = len(kept_to_original)


def model_card(checkpoint: PrunedCheckpoint) -> str:
    """A Hugging Face model card with ``base_model:`` metadata."""
    calibration = checkpoint.calibration or {}
    described = ", ".join(f"{key}={value}" for key, value in calibration.items()) or "given by hand"
    return (
        "---\n"
        f"base_model: {checkpoint.base_model}\n"
        "library_name: transformers\n"
        "tags:\n- depthprune\n- depth-pruning\n"
        "---\n\n"
        f"# Depth-pruned {checkpoint.base_model}\n\n"
        f"{len(checkpoint.removed_blocks)} of {checkpoint.base_num_blocks} decoder blocks removed "
        f"(original indices {checkpoint.removed_blocks}); the remaining blocks are renumbered "
        f"0..{len(checkpoint.kept_to_original) - 1}.\n\n"
        f"Calibration configuration: {described}.\n\n"
        f"{_source_line(checkpoint.base_source)}"
        f"See `{PRUNING_FILE}` for the kept-to-original block map, the base model's revision and "
        "weight hash, and the scores behind the choice.\n"
    )


def _source_line(source: GgufSource | None) -> str:
    if source is None:
        return ""
    return (
        f"The base model was dequantised to float32 from the GGUF file `{Path(source.path).name}` "
        f"({source.architecture}, sha256 `{source.sha256}`).\n\n"
    )


def _resolved_base(model: str, revision: str | None):
    """The dense model as a checkpoint records it: ``(model, its directory, revision, GGUF source or None)``;
    a GGUF is recorded by its converted directory, as ``prune`` records it."""
    base_source = resolve(model, revision).source
    model_dir, revision = resolve_model_dir(model, revision)
    if base_source is not None:
        model = str(model_dir.resolve())
    return model, model_dir, revision, base_source


def write_pruned_checkpoint(
    model: str,
    removed_blocks,
    out: str | Path,
    *,
    revision: str | None = None,
    calibration: dict | None = None,
    scores: dict | None = None,
    variant: VariantRecord | None = None,
    dtype: str | None = None,
    overwrite: bool = False,
) -> PrunedCheckpoint:
    """Write the variant of ``model`` without ``removed_blocks`` to ``out``.

    Args:
        model: hub id, local directory, ``PATH.gguf`` or embedded model name of the dense model.
        removed_blocks: original indices of the blocks to remove.
        out: directory to create.
        revision: hub revision of ``model``.
        calibration: the calibration configuration behind the choice, when no ``variant`` is given; if it
            names an objective, the variant is recorded as chosen by a ``manual`` search.
        scores: losses and search statistics (stored in ``pruning.json``); default: those of ``variant``.
        variant: the registry's record of this variant (``prune`` passes it), stored in ``pruning.json``
            with this checkpoint's path and sha256; it must name ``model`` and ``removed_blocks``.
        dtype: torch dtype to save in (default: the checkpoint's own).
        overwrite: replace ``out`` if it already exists.

    Returns:
        The :class:`PrunedCheckpoint` written to ``out/pruning.json``.
    """
    from transformers import AutoTokenizer

    from ground.core.version import __version__

    out = Path(out).expanduser()
    released = None if overwrite else released_weights(out)
    if released is not None:
        return restore_weights(out, released, model, removed_blocks, revision=revision, dtype=dtype)
    if out.exists() and not overwrite and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"{out} already exists; choose another --out or pass --overwrite")
    model, model_dir, revision, base_source = _resolved_base(model, revision)
    config = load_config(str(model_dir))
    removed = sorted(validate_removed(removed_blocks, config.num_hidden_layers))
    if scores is None:
        scores = {} if variant is None else scores_of(variant)
    variant = _variant_to_write(model, removed, calibration, scores, variant)
    kept_to_original = [i for i in range(config.num_hidden_layers) if i not in removed]
    causal_lm = _without_blocks(model_dir, kept_to_original, dtype)

    # Around the staging, not in it: a failed write is removed before the free space is measured.
    needed_bytes = partial(checkpoint_bytes, causal_lm, model_dir)  # counted only on a full disk
    with full_disk_as_user_error(out, needed_bytes=needed_bytes), staged_directory(out) as staging:
        causal_lm.save_pretrained(staging)
        AutoTokenizer.from_pretrained(model_dir).save_pretrained(staging)
        path, variant_sha256 = str(out.resolve()), weights_sha256(staging)
        share_identical_weights(staging, out.parent, variant_sha256)
        if variant is not None:
            variant = replace(variant, checkpoint_path=path, checkpoint_sha256=variant_sha256)
        checkpoint = PrunedCheckpoint(
            path=path,
            base_model=model,
            base_revision=revision,
            base_weights_sha256=weights_sha256(model_dir),
            architecture=config.model_type,
            base_num_blocks=config.num_hidden_layers,
            removed_blocks=removed,
            kept_to_original=kept_to_original,
            weights_sha256=variant_sha256,
            calibration=variant.calibration if variant is not None else calibration,
            scores=scores,
            created_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            depthprune_version=__version__,
            variant=variant,
            base_source=base_source,
        )
        (staging / PRUNING_FILE).write_text(json.dumps(asdict(checkpoint), indent=2) + "\n")
        (staging / "README.md").write_text(model_card(checkpoint))
    return checkpoint


def reusable_checkpoint(directory: Path, removed_blocks) -> tuple[PrunedCheckpoint | None, bool]:
    """What ``prune`` finds in a variant's directory before writing it: ``(checkpoint, False)`` when it holds
    this removal set with its weights (a resumed run reuses it); ``(None, True)`` when it holds this set's
    pruning.json without weights (copied from another machine without them, or emptied by hand: it is
    written again, and replaced, rather than registered unloadable); ``(None, False)`` when there is none.

    Raises:
        UserError: the directory holds another removal set.
    """
    if not (directory / PRUNING_FILE).is_file():
        return None, False
    existing = PrunedCheckpoint.read(directory)
    if list(existing.removed_blocks) != list(removed_blocks):
        raise UserError(
            f"{directory} holds removed blocks {existing.removed_blocks}, not {list(removed_blocks)}; "
            f"pass --overwrite to replace it"
        )
    if has_weight_files(directory):
        return existing, False
    print(f"{directory} has this variant's pruning.json but no weights: writing them again", file=sys.stderr)
    return None, True


def share_identical_weights(staging: Path, parent: Path, sha256: str) -> bool:
    """Make ``staging``'s weight files hard links to those of a sibling checkpoint with the same weights.

    A study writes one checkpoint per (calibration, search, mask), and many of them remove the same blocks
    (deterministic searches under several seeds, searches that agree), so identical weights would be
    stored dozens of times. Identity is the weights' sha256 recorded in the sibling's ``pruning.json``,
    checked against the files themselves before linking; a hard link keeps either checkpoint whole when
    the other is deleted. Where linking fails (another file system, no permission) the copy stays.

    Returns:
        Whether the weight files are now shared.
    """
    for sibling in sorted(parent.glob(f"*/{PRUNING_FILE}")):
        directory = sibling.parent
        if directory == staging:
            continue
        try:
            recorded = json.loads(sibling.read_text()).get("weights_sha256")
        except (OSError, ValueError):
            continue
        if recorded != sha256:
            continue
        ours = [path.name for path in weight_files(staging)]
        theirs = [path.name for path in weight_files(directory)]
        if ours != theirs or weights_sha256(directory) != sha256:
            continue
        try:
            for name in ours:
                temporary = staging / f".{name}.link"
                os.link(directory / name, temporary)
                os.replace(temporary, staging / name)
        except OSError:
            return False
        return True
    return False


def release_weights(directory: str | Path, base_model: str, removed_blocks, reason: str) -> int:
    """Delete the weight files of the checkpoint in ``directory`` on purpose, leaving its pruning.json,
    config, tokenizer and a :data:`~ground.core.checksums.WEIGHTS_RELEASED` note that says why and how
    to write them again (the same blocks removed from the same base model give the same weights). The note
    is written first, so a kill in between leaves a directory that says what happened.

    Returns:
        Bytes freed on this file system (0 for files that another checkpoint still links).
    """
    directory = Path(directory)
    files = weight_files(directory)
    if not files:
        return 0
    removed = ",".join(str(block) for block in sorted(removed_blocks))
    dtype = json.loads((directory / "config.json").read_text()).get("torch_dtype") or "float32"
    note = {
        "reason": reason,
        "weights_sha256": weights_sha256(directory),
        "rebuild": f"depthprune checkpoint --model {base_model} --remove {removed} --dtype {dtype} "
        f"--out {directory}",
    }
    write_text_atomically(directory / WEIGHTS_RELEASED, json.dumps(note, indent=2) + "\n")
    freed = 0
    for path in files:
        found = path.stat()
        freed += found.st_size if found.st_nlink == 1 else 0  # another checkpoint's link keeps the bytes
        path.unlink()
    return freed


def restore_weights(
    directory: Path,
    released: dict,
    model: str,
    removed_blocks,
    *,
    revision: str | None = None,
    dtype: str | None = None,
) -> PrunedCheckpoint:
    """Write again the weights :func:`release_weights` deleted from ``directory`` (``released``: its note),
    leaving every other file (pruning.json, the registry's manifest) as it was; the weights must hash to the
    released ones.

    Raises:
        UserError: another removal set, or weights that differ from the released ones (another base model
            revision or dtype).
    """
    existing = PrunedCheckpoint.read(directory)
    removed = sorted(int(block) for block in removed_blocks)
    if list(existing.removed_blocks) != removed:
        raise UserError(
            f"{directory} held removed blocks {existing.removed_blocks}, not {removed}; give its own blocks"
        )
    expected = released["weights_sha256"]
    model_dir, _ = resolve_model_dir(model, revision)
    causal_lm = _without_blocks(model_dir, existing.kept_to_original, dtype)
    staging = Path(tempfile.mkdtemp(prefix=".restore-", dir=directory.parent))
    try:
        causal_lm.save_pretrained(staging)
        actual = weights_sha256(staging)
        if actual != expected:
            raise UserError(
                f"the weights written again for {directory} hash to {actual[:12]}, not the released "
                f"{expected[:12]}: another base model revision or dtype; nothing was changed"
            )
        for path in weight_files(staging):
            os.replace(path, directory / path.name)
        (directory / WEIGHTS_RELEASED).unlink()
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return existing


def _variant_to_write(
    model: str, removed: list[int], calibration: dict | None, scores: dict, variant: VariantRecord | None
) -> VariantRecord | None:
    """The record ``pruning.json`` will carry: ``variant`` checked against the checkpoint, or one built."""
    if variant is None:
        return variant_from_scores(model, removed, calibration, scores)
    if calibration is not None:
        raise TypeError("pass the calibration in the variant record or on its own, not both")
    if variant.base_model != model or variant.removed_blocks != removed:
        raise ValueError(
            f"the variant record describes {variant.base_model} without blocks {variant.removed_blocks}, "
            f"but the checkpoint is {model} without blocks {removed}"
        )
    return variant


def _without_blocks(model_dir: Path, kept_to_original: list[int], dtype: str | None):
    """The causal LM of ``model_dir`` keeping only ``kept_to_original`` blocks, renumbered from 0."""
    import torch
    from transformers import AutoModelForCausalLM

    torch_dtype = "auto" if dtype is None else getattr(torch, dtype, None)
    if torch_dtype is None:
        raise UserError(f"unknown dtype {dtype!r}; use float32, bfloat16 or float16")
    causal_lm = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch_dtype)
    blocks = causal_lm.model.layers
    causal_lm.model.layers = torch.nn.ModuleList(blocks[i] for i in kept_to_original)
    for new_index, block in enumerate(causal_lm.model.layers):
        # Attention modules key their KV cache by layer_idx: it must follow the new numbering.
        for module in block.modules():
            if hasattr(module, "layer_idx"):
                module.layer_idx = new_index
    slice_per_layer_config(causal_lm.config, kept_to_original)
    return causal_lm


@contextmanager
def staged_directory(out: Path) -> Iterator[Path]:
    """Build a directory atomically: write into the yielded one, and it becomes ``out`` at the end.

    The staging directory is created beside ``out`` (same file system, so the final rename is atomic).
    When the ``with`` block succeeds, an existing ``out`` is replaced by it; when the block raises (Ctrl-C
    included), it is removed and ``out`` is left as it was, so no reader ever sees a half-written checkpoint.
    Pruned (:func:`write_pruned_checkpoint`) and healed (:mod:`pruning.healing.merge`) checkpoints are both
    written through it.

    Args:
        out: the directory to create or replace; its parent is created if needed.

    Yields:
        The empty staging directory to write into.
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        yield staging
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
