"""Greedy generation as the parity tests compare it: transformers in-process, the real vLLM engine apart.

A pruned checkpoint must generate, under vLLM, the greedy tokens transformers generates from it::

    generated = vllm_greedy([directory], prompts, max_tokens=8, work_dir=tmp_path)
    expected, gaps = transformers_greedy(model, prompts[0], max_tokens=8)

Random and tiny models have near-ties between their two best tokens, where float noise between two kernels
may flip a token; ``gaps`` lets a test tell such a flip from a real difference.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

__all__ = ["transformers_greedy", "vllm_greedy"]


def transformers_greedy(model, prompt: list[int], max_tokens: int) -> tuple[list[int], list[float]]:
    """Greedy tokens by full forwards (no cache), and the top-1 minus top-2 logit gap at each step.

    Args:
        model: a transformers causal LM in eval mode.
        prompt: token ids of the prompt.
        max_tokens: tokens to generate (end-of-sequence is not special).

    Returns:
        ``(generated token ids, logit gap per step)``.
    """
    import torch

    tokens, gaps = list(prompt), []
    with torch.no_grad():
        for _ in range(max_tokens):
            logits = model(torch.tensor([tokens]), use_cache=False).logits[0, -1]
            top = torch.topk(logits, 2).values
            gaps.append(float(top[0] - top[1]))
            tokens.append(int(logits.argmax()))
    return tokens[len(prompt) :], gaps


def vllm_greedy(
    models: list[str | Path],
    prompts: list[list[int]],
    max_tokens: int,
    work_dir: Path,
    timeout_s: float = 900,
    env: dict[str, str] | None = None,
) -> dict[str, list[list[int]]]:
    """Greedy tokens of each model for each prompt from the real vLLM engine, in a separate process.

    Runs :mod:`depthprune.testing.vllm_greedy` (vLLM owns its process' memory and spawns workers).

    Args:
        models: checkpoint directories.
        prompts: token ids of each prompt.
        max_tokens: tokens to generate per prompt (end-of-sequence ignored).
        work_dir: where the request and result files go.
        timeout_s: how long the process may take.
        env: variables added to the process' environment (e.g. ``VLLM_CPU_KVCACHE_SPACE``).

    Returns:
        ``str(directory) -> generated token ids per prompt``.

    Raises:
        RuntimeError: the process failed; the message ends with its stderr.
    """
    request, result = work_dir / "vllm-greedy-request.json", work_dir / "vllm-greedy-result.json"
    request.write_text(
        json.dumps({"models": [str(m) for m in models], "prompts": prompts, "max_tokens": max_tokens})
    )
    command = [sys.executable, "-m", "depthprune.testing.vllm_greedy", str(request), str(result)]
    environment = {**os.environ, **(env or {})}
    completed = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, env=environment)
    if completed.returncode != 0:
        raise RuntimeError(f"vLLM greedy generation failed:\n{completed.stderr[-4000:]}")
    return json.loads(result.read_text())
