"""Write a depth-pruned variant as an ordinary Hugging Face checkpoint.

The kept blocks are renumbered 0..N-M-1, ``num_hidden_layers`` is updated and every per-layer config
list is sliced by the kept *original* indices, so transformers and vLLM load the variant unchanged. Next
to the weights go the tokenizer, the generation config, ``pruning.json`` (what was removed from which
base model, and why) and a model card. Parity rule: the variant's logits equal the dense model run with
those blocks skipped (``pruning.models.BlockStack.forward``).

The directory is built under a temporary name beside ``out`` and renamed into place at the end, so a
failure or Ctrl-C never leaves a half-written checkpoint behind.

Command: ``depthprune checkpoint --model PATH_OR_ID --remove 3,7,8 --out DIR``.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from depthprune.checksums import weights_sha256
from depthprune.errors import UserError
from pruning.models import load_config, validate_removed

PRUNING_FILE = "pruning.json"


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
    """sha256 of the base model's weight files (:func:`depthprune.checksums.weights_sha256`)."""
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

    @classmethod
    def read(cls, directory: str | Path) -> PrunedCheckpoint:
        """Read ``pruning.json`` of a variant directory."""
        path = Path(directory) / PRUNING_FILE
        if not path.is_file():
            raise UserError(f"{directory} is not a depthprune variant (no {PRUNING_FILE})")
        return cls(**json.loads(path.read_text()))


def resolve_model_dir(model: str, revision: str | None = None) -> tuple[Path, str | None]:
    """Local directory of a model given as a directory or a hub id, and its hub revision.

    Hub ids go through the Hugging Face cache (``snapshot_download``), so the weights we hash are the
    ones transformers loads.
    """
    path = Path(model).expanduser()
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
        f"See `{PRUNING_FILE}` for the kept-to-original block map, the base model's revision and "
        "weight hash, and the scores behind the choice.\n"
    )


def write_pruned_checkpoint(
    model: str,
    removed_blocks,
    out: str | Path,
    *,
    revision: str | None = None,
    calibration: dict | None = None,
    scores: dict | None = None,
    dtype: str | None = None,
    overwrite: bool = False,
) -> PrunedCheckpoint:
    """Write the variant of ``model`` without ``removed_blocks`` to ``out``.

    Args:
        model: hub id or local directory of the dense model.
        removed_blocks: original indices of the blocks to remove.
        out: directory to create.
        revision: hub revision of ``model``.
        calibration: the calibration configuration behind the choice (stored in ``pruning.json``).
        scores: losses and search statistics (stored in ``pruning.json``).
        dtype: torch dtype to save in (default: the checkpoint's own).
        overwrite: replace ``out`` if it already exists.

    Returns:
        The :class:`PrunedCheckpoint` written to ``out/pruning.json``.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import depthprune

    out = Path(out).expanduser()
    if out.exists() and not overwrite and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"{out} already exists; choose another --out or pass --overwrite")
    model_dir, revision = resolve_model_dir(model, revision)
    config = load_config(str(model_dir))
    removed = sorted(validate_removed(removed_blocks, config.num_hidden_layers))
    kept_to_original = [i for i in range(config.num_hidden_layers) if i not in removed]
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

    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        causal_lm.save_pretrained(staging)
        AutoTokenizer.from_pretrained(model_dir).save_pretrained(staging)
        checkpoint = PrunedCheckpoint(
            path=str(out.resolve()),
            base_model=model,
            base_revision=revision,
            base_weights_sha256=weights_sha256(model_dir),
            architecture=config.model_type,
            base_num_blocks=len(blocks),
            removed_blocks=removed,
            kept_to_original=kept_to_original,
            weights_sha256=weights_sha256(staging),
            calibration=calibration,
            scores=scores or {},
            created_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            depthprune_version=depthprune.__version__,
        )
        (staging / PRUNING_FILE).write_text(json.dumps(asdict(checkpoint), indent=2) + "\n")
        (staging / "README.md").write_text(model_card(checkpoint))
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return checkpoint
