"""Benchmark: what does the depthprune gateway add on top of calling the vLLM backend directly?

What it does (every process it starts is stopped at the end):
1. starts one vLLM CPU OpenAI server for ``--model DIR`` (default: a tiny random Llama, the worst case for
   relative overhead because the engine itself is so fast);
2. starts ``depthprune serve --variants bench=URL`` in front of it (its own process, as in production);
3. latency: ``--rounds`` rounds of ``--pairs`` sequential request pairs, direct and through the gateway
   interleaved request by request (which goes first alternates), non-streaming (end-to-end latency) and
   streaming (time to first token); overhead = median of the per-pair differences;
4. throughput: in each round ``--requests`` requests at ``--concurrency`` against each target (order
   alternating between rounds so drift cancels); output tokens/s and their ratio;
5. prints JSON and writes ``## Gateway overhead`` (or ``--section``) into docs/benchmarks.md (replacing an
   older one) unless ``--no-write``.

Run: ``.venv/bin/python -m benchmarks.bench_gateway`` (about 3-5 minutes here, most of it the engine start).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

from benchmarks.docs_section import write_section
from depthprune.testing.models import save_tiny_model
from depthprune.testing.servers import running_gateway
from pruning.model.sources import resolve_model
from server.backends import Backend
from server.settings import BackendSpec, VllmOptions

SECTION = "## Gateway overhead"
PROMPT = " ".join(f"w{i}" for i in range(10, 42))  # 32 tokens of the tiny tokenizer's vocabulary


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model",
        help="Checkpoint directory, a .gguf file or smollm2-135m (the embedded real model, converted once); "
        "default: a tiny random Llama made here.",
    )
    parser.add_argument("--rounds", type=int, default=6, help="Interleaved rounds.")
    parser.add_argument("--pairs", type=int, default=20, help="Sequential direct/gateway pairs per round.")
    parser.add_argument("--requests", type=int, default=256, help="Requests per throughput measurement.")
    parser.add_argument("--concurrency", type=int, default=16, help="Concurrent requests for throughput.")
    parser.add_argument("--max-tokens", type=int, default=16, help="Output tokens per request (ignore_eos).")
    parser.add_argument(
        "--compile", action="store_true", help="Let vLLM compile (slow start); default eager."
    )
    parser.add_argument("--no-write", action="store_true", help="Do not write docs/benchmarks.md.")
    parser.add_argument(
        "--section", default=SECTION, help=f"Heading of the docs section to write (default {SECTION!r})."
    )
    parser.add_argument("--out", type=Path, help="Also write the JSON result here.")
    return parser.parse_args()


async def wait_healthy(backend: Backend) -> None:
    """Wait until the vLLM backend answers, as the gateway's own start-up does."""
    async with httpx.AsyncClient() as client:
        await backend.wait_healthy(client, 900, 5)


def body(max_tokens: int, stream: bool) -> dict:
    return {
        "model": "bench",
        "prompt": PROMPT,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": stream,
    }


async def one_request(
    client: httpx.AsyncClient, url: str, max_tokens: int, stream: bool
) -> tuple[float, float]:
    """(seconds to the first byte of content, seconds to the end) of one completion."""
    start = time.perf_counter()
    first = None
    async with client.stream("POST", f"{url}/v1/completions", json=body(max_tokens, stream)) as response:
        response.raise_for_status()
        async for _ in response.aiter_raw():
            if first is None:
                first = time.perf_counter() - start
    return first or 0.0, time.perf_counter() - start


async def latency_round(
    client, targets: dict[str, str], pairs: int, max_tokens: int, round_index: int
) -> dict:
    """Per-pair differences (gateway - direct) in seconds, for e2e (non-streaming) and TTFT (streaming)."""
    samples = {"direct_e2e": [], "gateway_e2e": [], "direct_ttft": [], "gateway_ttft": []}
    order = ["direct", "gateway"] if round_index % 2 == 0 else ["gateway", "direct"]
    for pair in range(pairs):
        for name in order if pair % 2 == 0 else order[::-1]:
            _, e2e = await one_request(client, targets[name], max_tokens, stream=False)
            ttft, _ = await one_request(client, targets[name], max_tokens, stream=True)
            samples[f"{name}_e2e"].append(e2e)
            samples[f"{name}_ttft"].append(ttft)
    return samples


async def throughput(client, url: str, requests: int, concurrency: int, max_tokens: int) -> float:
    """Output tokens per second of ``requests`` requests with at most ``concurrency`` in flight."""
    semaphore = asyncio.Semaphore(concurrency)

    async def limited():
        async with semaphore:
            response = await client.post(f"{url}/v1/completions", json=body(max_tokens, stream=False))
            response.raise_for_status()
            return response.json()["usage"]["completion_tokens"]

    start = time.perf_counter()
    tokens = sum(await asyncio.gather(*(limited() for _ in range(requests))))
    return tokens / (time.perf_counter() - start)


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure(targets: dict[str, str], args, gateway_pid: int) -> dict:
    limits = httpx.Limits(
        max_connections=args.concurrency * 2, max_keepalive_connections=args.concurrency * 2
    )
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        for url in targets.values():  # warm-up: connections, engine caches
            await asyncio.gather(
                *(one_request(client, url, args.max_tokens, stream=s) for s in (False, True) * 4)
            )
        latencies = {"direct_e2e": [], "gateway_e2e": [], "direct_ttft": [], "gateway_ttft": []}
        rates = {"direct": [], "gateway": []}
        gateway_cpu = []  # CPU seconds of the gateway process per proxied request
        for round_index in range(args.rounds):
            samples = await latency_round(client, targets, args.pairs, args.max_tokens, round_index)
            for key, values in samples.items():
                latencies[key].extend(values)
            order = ["direct", "gateway"] if round_index % 2 == 0 else ["gateway", "direct"]
            for name in order:
                cpu_before = process_cpu_seconds(gateway_pid)
                rates[name].append(
                    await throughput(client, targets[name], args.requests, args.concurrency, args.max_tokens)
                )
                if name == "gateway":
                    gateway_cpu.append((process_cpu_seconds(gateway_pid) - cpu_before) / args.requests)
            print(
                f"round {round_index + 1}/{args.rounds}: tokens/s direct {rates['direct'][-1]:.0f}, "
                f"gateway {rates['gateway'][-1]:.0f}",
                file=sys.stderr,
            )
    result = summarise(latencies, rates)
    result["gateway_cpu_ms_per_request"] = round(1000 * statistics.median(gateway_cpu), 2)
    return result


def summarise(latencies: dict[str, list[float]], rates: dict[str, list[float]]) -> dict:
    def ms(value: float) -> float:
        return round(value * 1000, 2)

    e2e_diff = [g - d for g, d in zip(latencies["gateway_e2e"], latencies["direct_e2e"])]
    ttft_diff = [g - d for g, d in zip(latencies["gateway_ttft"], latencies["direct_ttft"])]
    ratios = [g / d for g, d in zip(rates["gateway"], rates["direct"])]
    return {
        "pairs": len(e2e_diff),
        "direct_p50_e2e_ms": ms(statistics.median(latencies["direct_e2e"])),
        "gateway_p50_e2e_ms": ms(statistics.median(latencies["gateway_e2e"])),
        "overhead_p50_e2e_ms": ms(statistics.median(e2e_diff)),
        "direct_p50_ttft_ms": ms(statistics.median(latencies["direct_ttft"])),
        "gateway_p50_ttft_ms": ms(statistics.median(latencies["gateway_ttft"])),
        "overhead_p50_ttft_ms": ms(statistics.median(ttft_diff)),
        "direct_output_tokens_per_s": [round(r, 1) for r in rates["direct"]],
        "gateway_output_tokens_per_s": [round(r, 1) for r in rates["gateway"]],
        "throughput_ratio_median": round(statistics.median(ratios), 4),
        "throughput_ratio_overall": round(sum(rates["gateway"]) / sum(rates["direct"]), 4),
    }


def reproduce_flags(args) -> str:
    flags = f"--rounds {args.rounds} --pairs {args.pairs} --requests {args.requests}"
    flags += f" --concurrency {args.concurrency} --max-tokens {args.max_tokens}"
    return flags if args.model is None else f"--model {args.model} {flags}"


def markdown(result: dict, args, model: str) -> str:
    goal_latency = "met" if result["overhead_p50_e2e_ms"] < 5 else "NOT met"
    goal_rate = "met" if abs(1 - result["throughput_ratio_median"]) <= 0.05 else "NOT met"
    return f"""{args.section}

The gateway (`depthprune serve`, its own process) in front of one vLLM CPU server, against calling that
server directly; requests interleaved pair by pair (which goes first alternates) so machine drift cancels.
Model: {model}; prompt `w10 w11 … w41` (32 words), {args.max_tokens} output tokens (`ignore_eos`), greedy.
Machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}.

| measure | direct | through the gateway | overhead |
|---|---|---|---|
| p50 end-to-end latency, sequential, non-streaming | {result["direct_p50_e2e_ms"]} ms | {result["gateway_p50_e2e_ms"]} ms | **{result["overhead_p50_e2e_ms"]} ms** (goal < 5 ms: {goal_latency}) |
| p50 time to first token, sequential, streaming | {result["direct_p50_ttft_ms"]} ms | {result["gateway_p50_ttft_ms"]} ms | {result["overhead_p50_ttft_ms"]} ms |
| output tokens/s, {args.requests} requests at concurrency {args.concurrency} (per round) | {", ".join(f"{r:.0f}" for r in result["direct_output_tokens_per_s"])} | {", ".join(f"{r:.0f}" for r in result["gateway_output_tokens_per_s"])} | ratio **{result["throughput_ratio_median"]}** (median of rounds; goal within 5 %: {goal_rate}) |
| gateway process CPU per proxied request (throughput phase) | | | {result["gateway_cpu_ms_per_request"]} ms |

Overheads are medians of {result["pairs"]} per-pair differences over {args.rounds} rounds; overall throughput ratio
(sum over rounds) {result["throughput_ratio_overall"]}; load average {result["load_average"][0]} before the run and
{result["load_average"][1]} after it. {"The tiny model makes the engine's own time small, so this is the worst case for the relative overhead. " if args.model is None else ""}On a
machine whose 2 cores are shared with other jobs the gateway competes with the engine for CPU and every extra
process hop waits for the scheduler; the CPU cost per request is the machine-independent figure.
Reproduce: `.venv/bin/python -m benchmarks.bench_gateway {reproduce_flags(args)}`.
"""  # noqa: E501


def main() -> None:
    args = parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-gateway-") as work:
        work = Path(work)
        model = resolve_model(args.model).model if args.model else None
        model = model or str(save_tiny_model("llama", work / "tiny-llama"))
        vllm_options = VllmOptions(
            dtype="float32",
            max_model_len=256,
            log_dir=str(work),
            extra_args=[] if args.compile else ["--enforce-eager"],
        )
        backend = Backend(BackendSpec("bench", model_dir=model), vllm_options)
        try:
            print("starting vLLM ...", file=sys.stderr)
            backend.spawn()
            asyncio.run(wait_healthy(backend))
            log, env = work / "gateway.log", {"DEPTHPRUNE_HOME": str(work)}
            with running_gateway(f"bench={backend.url}", log, "--log-level", "warning", env=env) as gateway:
                targets = {"direct": backend.url, "gateway": gateway.url}
                load_before = os.getloadavg()[0]
                result = asyncio.run(measure(targets, args, gateway.process.pid))
                result["load_average"] = [round(load_before, 1), round(os.getloadavg()[0], 1)]
        finally:
            backend.stop()
    model_name = "tiny random Llama (6 blocks, hidden 64, float32)" if not args.model else f"`{args.model}`"
    result["model"] = model_name
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
    text = markdown(result, args, model_name)
    print(text)
    if not args.no_write:
        write_section(args.section, text)


if __name__ == "__main__":
    main()
