"""Build a ready :class:`~pruning.calibration.scoring.evaluator.SubsetEvaluator` from a model and a
calibration configuration: data drawn, model loaded, dense reference pass run.
"""

from __future__ import annotations

import time

from ground.core.errors import UserError
from pruning.calibration.config import CalibrationConfig
from pruning.calibration.data.sampling import load_samples
from pruning.calibration.objectives.batches import make_batches, truncated_items
from pruning.calibration.scoring.evaluator import SubsetEvaluator
from pruning.model.blocks import BlockStack, load_config, load_model


def build_evaluator(
    model: str,
    config: CalibrationConfig,
    *,
    dtype: str = "float32",
    device: str = "cpu",
    memory_budget_gb: float | None = None,
    naive: bool = False,
    progress: bool = True,
    batch_size: int = 8,
    split: str = "calibration",
    pack_choices: bool = True,
    shortcuts: bool = True,
    gpus: int = 1,
    fused_blocks: bool = False,
) -> SubsetEvaluator:
    """Load a model and its calibration data, and run the dense reference pass.

    Every input is checked (objective and data kind, the data itself, the model's config) before the model's
    weights are loaded.

    Args:
        model: hub id or local directory of a supported causal LM.
        config: the calibration configuration.
        dtype: torch dtype the model runs in.
        device: torch device.
        memory_budget_gb: how much memory the boundary cache (and the KL reference) may take on ``device``;
            default half of the free GPU memory, or a quarter of the available host memory on CPU.
        naive: score by a full forward per candidate with no cache or memo (for benchmarks).
        progress: show progress bars.
        batch_size: sequences per forward (packed: questions per forward).
        split: ``calibration`` (default) or ``test`` split of the data source.
        pack_choices: run each question's choices as one sequence sharing the prompt (exact; ignored for
            text objectives, in naive mode and for attention implementations without 4-D masks).
        shortcuts: cache the boundaries of the sets searches extend, share prefixes within a group of
            sets, and stop ranking candidates at a lower bound (exact; ``False`` scores as before them).
        gpus: cards to spread the model over from ``device`` on (:func:`pruning.model.blocks.load_model`).
        fused_blocks: run the blocks through one ``torch.compile``-d forward (CUDA only; scores equal within
            bfloat16 rounding, not bit for bit: :mod:`pruning.calibration.scoring.fusion`).

    Returns:
        A ready :class:`SubsetEvaluator`.
    """
    from transformers import AutoTokenizer

    if not isinstance(config, CalibrationConfig):
        raise TypeError("config must be a CalibrationConfig")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise UserError(f"batch size must be a positive integer, got {batch_size!r}")
    if memory_budget_gb is not None and memory_budget_gb < 0:
        raise UserError(f"memory budget must be >= 0 GiB, got {memory_budget_gb}")
    started = time.perf_counter()
    load_config(model)
    tokenizer = AutoTokenizer.from_pretrained(model)
    samples = load_samples(
        config.data, tokenizer, config.samples, config.seq_len, config.seed, split, config.sampling
    )
    batches = make_batches(samples, tokenizer, config.seq_len, batch_size, config.truncate)
    truncated = truncated_items(samples, tokenizer, config.seq_len) if config.truncate else 0
    causal_lm, _ = load_model(model, dtype=dtype, device=device, gpus=gpus)
    evaluator = SubsetEvaluator(
        BlockStack(causal_lm),
        config,
        batches,
        model_id=str(model),
        dtype=dtype,
        memory_budget_gb=memory_budget_gb,
        naive=naive,
        progress=progress,
        pack_choices=pack_choices,
        packed_rows=batch_size,
        shortcuts=shortcuts,
        fused_blocks=fused_blocks,
    )
    evaluator.stats.setup_seconds = time.perf_counter() - started
    evaluator.truncated_items = truncated
    evaluator.tokenizer = tokenizer
    return evaluator
