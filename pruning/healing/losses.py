"""Healing losses with bounded memory: next-token NLL and top-k distillation KL, a chunk of positions at once.

The LM head turns every position into a vocabulary-sized row of logits; on a 128k vocabulary a batch of
8 x 2,048 positions would need 8 GiB for the logits alone, and as much again for their gradient. Here the
head runs on ``CHUNK_POSITIONS`` positions at a time, and in training each chunk is checkpointed
(``torch.utils.checkpoint``): only the chunk's hidden states are kept for the backward pass, which
recomputes its logits. Memory is then one chunk of logits, whatever the batch.

Distillation (``distill``) keeps the teacher's ``top_k`` most likely next tokens per position and lumps
the rest of the vocabulary into one "tail" outcome: the loss is the KL between teacher and student over
those k + 1 outcomes, ``sum_k p(k) log(p(k) / q(k)) + p_tail log(p_tail / q_tail)``, with ``p`` and ``q``
the full softmaxes of teacher and student. Coarse-graining never increases a KL, so this is a lower bound
of KL(teacher || student) that equals it when ``top_k`` covers the vocabulary. Unlike renormalising the
teacher over its top k, it does not teach the student to put all its mass on k tokens when the teacher
spreads its own more widely.
"""

from __future__ import annotations

import torch
import torch.nn.functional as functional
from torch.utils.checkpoint import checkpoint

CHUNK_POSITIONS = 512
"""Positions whose logits exist at once (512 x 128k float32 = 256 MiB)."""
TAIL_FLOOR = 1e-12
"""Smallest tail probability taken into a logarithm (a top k that holds all the mass leaves none)."""


def output_logits(causal_lm, hidden: torch.Tensor) -> torch.Tensor:
    """LM head of normalised hidden states, in float32, with the soft-capping of models that use it."""
    logits = causal_lm.lm_head(hidden).float()
    cap = getattr(causal_lm.config, "final_logit_softcapping", None)
    if cap is not None:
        logits = torch.tanh(logits / cap) * cap
    return logits


def final_hidden(causal_lm, input_ids: torch.Tensor) -> torch.Tensor:
    """Hidden states after the final norm, ``[batch, seq, hidden]`` (what the LM head reads)."""
    return causal_lm.model(input_ids=input_ids, use_cache=False).last_hidden_state


def _predicting(hidden: torch.Tensor, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Hidden states of the positions that predict a next token, and those tokens, both flattened."""
    # A model spread over several cards (device_map) ends on its last card; the tokens start on the first.
    return hidden[:, :-1].reshape(-1, hidden.shape[-1]), input_ids[:, 1:].reshape(-1).to(hidden.device)


@torch.no_grad()
def teacher_top_k(teacher, input_ids: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The teacher's ``top_k`` next tokens per predicting position and their log-probabilities.

    Returns:
        ``(indices, log_probs)``, each ``[batch * (seq - 1), k]``; log-probabilities under the full softmax.
    """
    hidden, _ = _predicting(final_hidden(teacher, input_ids), input_ids)
    indices, log_probs = [], []
    for start in range(0, hidden.shape[0], CHUNK_POSITIONS):
        full = functional.log_softmax(output_logits(teacher, hidden[start : start + CHUNK_POSITIONS]), -1)
        top = full.topk(min(top_k, full.shape[-1]), dim=-1)
        indices.append(top.indices)
        log_probs.append(top.values)
    return torch.cat(indices), torch.cat(log_probs)


def _chunk_sums(causal_lm, hidden, targets, teacher_indices, teacher_log_probs):
    """Summed NLL of ``targets`` and summed top-k KL (0 without a teacher) over one chunk of positions."""
    log_q = functional.log_softmax(output_logits(causal_lm, hidden), -1)
    nll = -log_q.gather(-1, targets[:, None]).sum()
    if teacher_indices is None:
        return nll, torch.zeros((), device=nll.device)
    teacher_indices, teacher_log_probs = teacher_indices.to(log_q.device), teacher_log_probs.to(log_q.device)
    log_q_top = log_q.gather(-1, teacher_indices)
    kl = (teacher_log_probs.exp() * (teacher_log_probs - log_q_top)).sum()
    p_tail = (1 - teacher_log_probs.exp().sum(-1)).clamp(min=TAIL_FLOOR)
    q_tail = (1 - log_q_top.exp().sum(-1)).clamp(min=TAIL_FLOOR)
    return nll, kl + (p_tail * (p_tail.log() - q_tail.log())).sum()


def token_losses(
    causal_lm, input_ids: torch.Tensor, teacher_top: tuple[torch.Tensor, torch.Tensor] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean next-token NLL and mean top-k KL per predicting position of ``input_ids``.

    Args:
        causal_lm: the student (a transformers causal LM, adapters injected or not).
        input_ids: ``[batch, seq]`` token windows.
        teacher_top: :func:`teacher_top_k` of the same windows; None gives a KL of 0.

    Returns:
        ``(nll, kl)``, scalars; differentiable when gradients are enabled.
    """
    hidden, targets = _predicting(final_hidden(causal_lm, input_ids), input_ids)
    nll_sum = kl_sum = torch.zeros((), device=hidden.device)
    for start in range(0, hidden.shape[0], CHUNK_POSITIONS):
        end = start + CHUNK_POSITIONS
        chunk = (
            hidden[start:end],
            targets[start:end],
            None if teacher_top is None else teacher_top[0][start:end],
            None if teacher_top is None else teacher_top[1][start:end],
        )
        if torch.is_grad_enabled():
            nll, kl = checkpoint(_chunk_sums, causal_lm, *chunk, use_reentrant=False)
        else:
            nll, kl = _chunk_sums(causal_lm, *chunk)
        nll_sum, kl_sum = nll_sum + nll, kl_sum + kl
    return nll_sum / targets.numel(), kl_sum / targets.numel()
