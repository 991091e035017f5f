"""Per-sample gradients of the calibration loss with respect to each block's residual branch (CBO's matrix A).

Each block's output becomes h + α_i·(block(h) − h), α = 1 (the dense model), and one backward pass per
calibration batch gives dL_s/dα_i for every sample s of it: samples are independent in a batch, so the
gradient of the batch's summed loss row s is sample s's.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from tqdm.auto import tqdm

from pruning.calibration.scoring.packing import RunBatch
from pruning.calibration.scoring.reference import KLReference
from pruning.calibration.scoring.runner import BlockRunner


def residual_gradients(
    runner: BlockRunner,
    run_batches: list[RunBatch],
    loss: Callable,
    reference: KLReference,
    progress: bool,
) -> np.ndarray:
    """``[samples, N]`` per-sample gradients dL_s/dα_i at α = 1, block output h + α_i·(block(h) − h).

    Args:
        runner: the model's blocks (their own forwards, never a compiled one: gradients flow through them).
        run_batches: what the blocks run.
        loss: the configured loss, ``loss(batch, hidden, head, reference) -> per-sample losses``.
        reference: the KL reference.
        progress: show a progress bar.
    """
    stack, num_blocks = runner.stack, runner.num_blocks
    rows = []
    bar = tqdm(run_batches, desc="residual gradients", unit="batch", disable=not progress)
    for batch_index, run in enumerate(bar):
        batch = run.calibration
        with torch.no_grad():
            prepared = stack.prepare(run.input_ids, run.attention_mask, run.position_ids)
        alphas = torch.ones(
            batch.num_samples,
            num_blocks,
            device=runner.device,
            dtype=prepared.hidden.dtype,
            requires_grad=True,
        )
        row_alphas = alphas[run.sample_of_row]
        with torch.enable_grad():
            hidden = prepared.hidden
            for index, block in enumerate(stack.blocks):
                hidden = stack.to_block_device(index, hidden)
                output = block(hidden, **prepared.block_kwargs[index])
                alpha = row_alphas[:, index, None, None].to(hidden.device)
                hidden = hidden + alpha * (output - hidden)
            runner.count_blocks(run, num_blocks)
            losses = loss(batch, run.objective_hidden(hidden), runner.head, reference.for_batch(batch_index))
            # Samples are independent in a batch, so the gradient of the sum row s is dL_s/dα.
            (gradient,) = torch.autograd.grad(losses.sum(), alphas)
        rows.append(gradient.double().cpu())
    return torch.cat(rows).numpy()
