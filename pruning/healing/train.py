"""The healing training loop: LoRA adapters (or whole blocks) trained by NLL or distillation.

:func:`trainable_model` puts LoRA adapters on the variant through ``peft`` (``LoraConfig``,
``get_peft_model``; adapters initialised from the seed, dropout 0 so that a step is a pure function of the
weights and the batch), or, for a full fine-tune, unfreezes the decoder blocks only, or for ``last-blocks``
the LM head and the last blocks only (Reassessing Layer Pruning's partial-layer fine-tuning). :func:`train`
runs AdamW with a warm-up and cosine schedule computed from the step, clips gradients at 1, shows the loss in
a progress bar, and saves its state (:mod:`pruning.healing.state`) so that Ctrl-C and a re-run resume.
"""

from __future__ import annotations

import math
import time

import torch
from torch import nn

from ground.core.errors import UserError
from pruning.healing.config import HealConfig
from pruning.healing.data import HealingData, batch_windows
from pruning.healing.losses import teacher_top_k, token_losses
from pruning.healing.state import DeferredInterrupt, TrainingState, load_state, save_state

MIN_LR_FRACTION = 0.1
"""The cosine schedule ends at this fraction of the peak learning rate."""
WARMUP_FRACTION = 0.05
"""Share of the steps spent warming the learning rate up linearly."""
MAX_GRAD_NORM = 1.0


def block_linear_names(causal_lm) -> set[str]:
    """Names (last component) of the linear modules inside the decoder blocks: possible LoRA targets."""
    return {
        name.rsplit(".", 1)[-1]
        for name, module in causal_lm.model.layers.named_modules()
        if isinstance(module, nn.Linear)
    }


def trainable_modules(causal_lm, config: HealConfig) -> list[nn.Module] | None:
    """The modules trained whole (no adapters): the decoder blocks for a full fine-tune; the LM head and the
    last ``config.last_blocks`` blocks for ``last-blocks``; None when adapters are trained.

    With tied embeddings the LM head's matrix is the input embedding's: ``last-blocks`` then trains it on
    both sides (the parameter count is unchanged).
    """
    if config.method == "last-blocks":
        return [causal_lm.lm_head, *causal_lm.model.layers[-config.last_blocks :]]
    return [causal_lm.model.layers] if config.full_finetune else None


def trainable_model(causal_lm, config: HealConfig):
    """``causal_lm`` made trainable as ``config`` says: a ``PeftModel`` with LoRA adapters, or the model
    itself with only some modules unfrozen (:func:`trainable_modules`).

    Raises:
        UserError: a LoRA target that is not a linear module of the blocks.
    """
    whole = trainable_modules(causal_lm, config)
    if whole is not None:
        for parameter in causal_lm.parameters():
            parameter.requires_grad_(False)
        for module in whole:
            for parameter in module.parameters():
                parameter.requires_grad_(True)
        return causal_lm
    available = block_linear_names(causal_lm)
    unknown = [target for target in config.lora_targets if target not in available]
    if unknown:
        raise UserError(
            f"--lora-targets {unknown[0]!r} is not a linear module of the blocks; "
            f"choose from {', '.join(sorted(available))}"
        )
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(config.seed)  # the adapters' initialisation
    lora = LoraConfig(
        r=config.lora_rank,
        lora_alpha=config.lora_alpha,
        target_modules=list(config.lora_targets),
        lora_dropout=0.0,
        bias="none",
        task_type="CAUSAL_LM",
    )
    return get_peft_model(causal_lm, lora)


def underlying_causal_lm(model):
    """The transformers model inside a ``PeftModel`` (adapters injected), or ``model`` itself."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def learning_rate(config: HealConfig, step: int) -> float:
    """Learning rate of step ``step`` (from 0): linear warm-up, then cosine decay to a tenth of the peak."""
    warmup = max(1, round(WARMUP_FRACTION * config.steps))
    if step < warmup:
        return config.lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, config.steps - warmup)
    return config.lr * (MIN_LR_FRACTION + (1 - MIN_LR_FRACTION) * 0.5 * (1 + math.cos(math.pi * progress)))


@torch.no_grad()
def heldout_loss(causal_lm, windows: list[list[int]], batch_size: int, device: str) -> float:
    """Mean next-token NLL over ``windows`` (every window the same length)."""
    was_training = causal_lm.training
    causal_lm.eval()
    total, count = 0.0, 0
    for start in range(0, len(windows), batch_size):
        input_ids = torch.tensor(windows[start : start + batch_size], device=device)
        nll, _ = token_losses(causal_lm, input_ids)
        predicted = input_ids.shape[0] * (input_ids.shape[1] - 1)
        total, count = total + float(nll) * predicted, count + predicted
    causal_lm.train(was_training)
    return total / count


def _step(model, teacher, optimizer, input_ids: torch.Tensor, config: HealConfig, step: int) -> float:
    """One optimizer step on one batch; returns its training loss."""
    for group in optimizer.param_groups:
        group["lr"] = learning_rate(config, step)
    optimizer.zero_grad(set_to_none=True)
    causal_lm = underlying_causal_lm(model)
    if config.method == "distill":
        nll, kl = token_losses(causal_lm, input_ids, teacher_top_k(teacher, input_ids, config.distill_top_k))
        loss = kl + config.lm_loss_weight * nll
    else:
        loss, _ = token_losses(causal_lm, input_ids)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(
        [parameter for parameter in model.parameters() if parameter.requires_grad], MAX_GRAD_NORM
    )
    optimizer.step()
    return float(loss.detach())


def train(model, teacher, data: HealingData, config: HealConfig, run_dir) -> TrainingState:
    """Train ``model`` for ``config.steps`` steps, resuming from ``run_dir`` when a state is saved there.

    Args:
        model: from :func:`trainable_model`.
        teacher: the dense model for ``distill`` (eval mode, frozen); None for ``lora``.
        data: the training windows.
        config: the run.
        run_dir: where the state is saved.

    Returns:
        The final state (every step's loss, the training time).

    Raises:
        KeyboardInterrupt: after Ctrl-C (or ``config.stop_after`` steps), once the state is saved.
    """
    from tqdm import tqdm

    optimizer = torch.optim.AdamW(
        [parameter for parameter in model.parameters() if parameter.requires_grad],
        lr=config.lr,
        weight_decay=0.0,
    )
    state = load_state(run_dir, model, optimizer) or TrainingState()
    model.train()
    bar = tqdm(
        total=config.steps,
        initial=state.step,
        desc=f"heal {config.method}",
        unit="step",
        disable=not config.progress,
    )
    with bar, DeferredInterrupt() as interrupt:
        while state.step < config.steps:
            started = time.perf_counter()
            batch = batch_windows(len(data.train_windows), config.batch_size, config.seed, state.step)
            input_ids = torch.tensor([data.train_windows[index] for index in batch], device=config.device)
            loss = _step(model, teacher, optimizer, input_ids, config, state.step)
            state.step += 1
            state.wall_seconds += time.perf_counter() - started
            state.losses.append(loss)
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.4f}")
            stop = interrupt.requested or state.step == config.stop_after
            if stop or state.step % config.save_every == 0 or state.step == config.steps:
                save_state(run_dir, model, optimizer, state)
            if stop:
                raise KeyboardInterrupt
    model.eval()
    return state
