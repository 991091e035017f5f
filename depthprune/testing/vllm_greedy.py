"""Greedy generation with the real vLLM engine, one engine per checkpoint, run as a separate process.

Usage: python -m depthprune.testing.vllm_greedy REQUEST.json RESULT.json, where the request is
``{"models": [dir, ...], "prompts": [[token ids], ...], "max_tokens": n}`` and the result maps each
directory to its generated token ids per prompt. A separate process because vLLM spawns workers and
owns the process' memory; the ``__main__`` guard is required for the same reason.
"""

import gc
import json
import sys


def generate(models: list[str], prompts: list[list[int]], max_tokens: int) -> dict[str, list[list[int]]]:
    import os

    # On the CPU build a memory fraction of 0.1 leaves a 0.5 GB model no KV cache: give it 1 GiB outright.
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    # The engine core and its worker in this process, as the in-process lm-eval model runs them: two engines
    # of the tiny llama took 37 s instead of 110 s (each engine otherwise spawns two processes that import
    # vLLM and torch again); this process exists for vLLM alone, so nothing else shares it.
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    results = {}
    for model in models:
        llm = LLM(
            model=model,
            dtype="float32",
            max_model_len=256,
            gpu_memory_utilization=0.1,
            enforce_eager=True,
            seed=0,
        )
        outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        results[model] = [list(output.outputs[0].token_ids) for output in outputs]
        del llm
        gc.collect()
    return results


if __name__ == "__main__":
    request = json.load(open(sys.argv[1]))
    with open(sys.argv[2], "w") as handle:
        json.dump(generate(request["models"], request["prompts"], request["max_tokens"]), handle)
