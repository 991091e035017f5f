"""Benchmark: does a variant with 25 % of its blocks removed reach the ideal N/(N-M) throughput speedup
when served, and does ``depthprune loadtest`` agree with ``vllm bench serve`` on the same backend?

What it does (every process it starts is stopped at the end):
1. takes the demo model (``depthprune.demo.model.ensure_demo_model()``) or ``--model DIR``;
2. writes a variant without round(N/4) evenly spread blocks (``pruning.checkpoint.write_pruned_checkpoint``);
3. starts one vLLM CPU server per model with identical settings, and the depthprune gateway in front
   (``depthprune serve --variants dense=URL,v25=URL``; ``--direct`` skips the gateway);
4. in each of ``--rounds`` rounds, measures both models at saturation (all requests at once) with the
   ``loadtest`` package, then with ``vllm bench serve`` (``vllm.benchmarks.serve``) on the same prompts,
   so the two tools and the two models are interleaved and drift cancels;
5. writes ``summary.json``, the load-test result and report (Markdown + PNG) into ``--out``, and prints the
   Markdown for docs/benchmarks.md.

Run: ``.venv/bin/python benchmarks/bench_loadtest.py --out /tmp/bench-loadtest`` (about 5-10 minutes here).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from depthprune.demo.paths import data_file
from loadtest.benchmark import Benchmark, Measurement, build_result, run
from loadtest.compare import BlockCounts, geometric_mean
from loadtest.config import LoadConfig
from loadtest.prompts import HFTokenizer, build_prompts
from loadtest.report import markdown_report, write_report

COMPARED_KEYS = (
    "output_throughput",
    "request_throughput",
    "mean_ttft_ms",
    "mean_tpot_ms",
    "mean_itl_ms",
    "mean_e2el_ms",
)
AGREEMENT_TOLERANCE = 0.15
TARGET_FRACTION = 0.9


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until_up(url: str, process: subprocess.Popen, log: Path, timeout_s: float = 900) -> None:
    """Poll ``url`` until it answers 200; fail with the log's tail if the process dies or time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"{log} process exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=3).status_code == 200:
                return
        time.sleep(1)
    raise SystemExit(f"{url} not up after {timeout_s} s; see {log}")


def start(command: list[str], log: Path, env: dict | None = None) -> subprocess.Popen:
    with open(log, "w") as handle:
        return subprocess.Popen(
            command, stdout=handle, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )


def vllm_server(model_dir: Path, name: str, args, out: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    log = out / f"vllm-{name}.log"
    process = start(
        [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(model_dir),
            "--served-model-name",
            name,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--dtype",
            args.dtype,
            "--max-model-len",
            str(args.max_model_len),
        ],
        log,
        env={"VLLM_CPU_KVCACHE_SPACE": str(args.kv_cache_gib)},
    )
    url = f"http://127.0.0.1:{port}"
    wait_until_up(url + "/health", process, log)
    return process, url


def removed_blocks_for(num_blocks: int, fraction: float) -> list[int]:
    """round(fraction * N) blocks spread evenly over the stack (which ones does not change the speed)."""
    removed = max(1, round(num_blocks * fraction))
    return sorted({int((i + 0.5) * num_blocks / removed) for i in range(removed)})


def vllm_bench_serve(target: str, model: str, tokenizer_dir: Path, prompts_file: Path, args) -> dict:
    """One ``vllm bench serve`` run at saturation on the prompts of ``prompts_file``; its result dict."""
    from vllm.benchmarks.serve import add_cli_args, main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    bench_args = parser.parse_args(
        [
            "--backend",
            "openai",
            "--base-url",
            target,
            "--endpoint",
            "/v1/completions",
            "--model",
            model,
            "--tokenizer",
            str(tokenizer_dir),
            "--dataset-name",
            "custom",
            "--dataset-path",
            str(prompts_file),
            "--custom-output-len",
            str(args.output_len),
            "--skip-chat-template",
            "--disable-shuffle",
            "--num-prompts",
            str(args.num_prompts),
            "--request-rate",
            "inf",
            "--ignore-eos",
            "--temperature",
            "0",
            "--percentile-metrics",
            "ttft,tpot,itl,e2el",
            "--metric-percentiles",
            "90,99",
            "--disable-tqdm",
            "--seed",
            str(args.seed),
        ]
    )
    with contextlib.redirect_stdout(sys.stderr):
        result = main(bench_args)
    return {key: value for key, value in result.items() if not isinstance(value, list)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="Dense model directory (default: the demo model).")
    parser.add_argument("--removed-fraction", type=float, default=0.25)
    parser.add_argument("--out", type=Path, default=Path("bench-loadtest"))
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--input-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--max-model-len", type=int, default=512)
    parser.add_argument("--kv-cache-gib", type=int, default=1)
    parser.add_argument("--direct", action="store_true", help="Measure the vLLM servers without the gateway.")
    args = parser.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)

    if args.model is None:
        from depthprune.demo.model import ensure_demo_model

        model_dir = Path(ensure_demo_model())
    else:
        model_dir = args.model.resolve()
    num_blocks = json.loads((model_dir / "config.json").read_text())["num_hidden_layers"]
    removed = removed_blocks_for(num_blocks, args.removed_fraction)
    variant_name = f"v{round(100 * len(removed) / num_blocks)}"
    variant_dir = out / variant_name
    if not (variant_dir / "pruning.json").is_file():
        from pruning.checkpoint import write_pruned_checkpoint

        write_pruned_checkpoint(str(model_dir), removed, variant_dir, overwrite=True)
    counts = {
        "dense": BlockCounts(num_blocks, 0, "bench"),
        variant_name: BlockCounts(num_blocks, len(removed), "bench"),
    }
    print(f"dense: {model_dir} ({num_blocks} blocks); {variant_name}: removed {removed}", file=sys.stderr)

    processes: list[subprocess.Popen] = []
    try:
        dense_process, dense_url = vllm_server(model_dir, "dense", args, out)
        processes.append(dense_process)
        variant_process, variant_url = vllm_server(variant_dir, variant_name, args, out)
        processes.append(variant_process)
        if args.direct:
            targets = {"dense": dense_url, variant_name: variant_url}
            target = f"{dense_url} (dense), {variant_url} ({variant_name}): direct"
        else:
            port = free_port()
            log = out / "gateway.log"
            gateway = start(
                [
                    sys.executable,
                    "-m",
                    "depthprune",
                    "serve",
                    "--variants",
                    f"dense={dense_url},{variant_name}={variant_url}",
                    "--port",
                    str(port),
                ],
                log,
            )
            processes.append(gateway)
            target = f"http://127.0.0.1:{port}"
            wait_until_up(target + "/ready", gateway, log, timeout_s=120)
            targets = {"dense": target, variant_name: target}

        demo_text = data_file(model_dir, "text_test")
        config = LoadConfig(
            num_prompts=args.num_prompts,
            input_len=args.input_len,
            output_len=args.output_len,
            warmup=4,
            seed=args.seed,
            rounds=args.rounds,
            prompts=str(demo_text) if demo_text.is_file() else "synthetic",
        )
        tokenizer = HFTokenizer(model_dir)
        prompts = build_prompts(
            config.prompts, config.warmup + config.num_prompts, config.input_len, tokenizer, seed=config.seed
        )
        warmup, measured = prompts[: config.warmup], prompts[config.warmup :]
        prompts_file = out / "prompts.jsonl"
        prompts_file.write_text("".join(json.dumps({"prompt": p.text}) + "\n" for p in measured))

        benchmark = Benchmark(targets, config)
        run(benchmark.warm_up(warmup))
        ours = Measurement(rate=math.inf)
        theirs: dict[str, list[dict]] = {model: [] for model in targets}
        for round_index in range(args.rounds):
            # Alternate which tool goes first (and the model order of vLLM's runs): drift hits both alike.
            order = list(targets) if round_index % 2 == 0 else list(targets)[::-1]
            if round_index % 2 == 1:
                for model in order:
                    theirs[model].append(
                        vllm_bench_serve(targets[model], model, model_dir, prompts_file, args)
                    )
            step = run(benchmark.measure([measured]))
            for one_run in step.runs:
                one_run.round = round_index
            ours.runs.extend(step.runs)
            if round_index % 2 == 0:
                for model in order:
                    theirs[model].append(
                        vllm_bench_serve(targets[model], model, model_dir, prompts_file, args)
                    )
            print(f"round {round_index + 1}/{args.rounds} done", file=sys.stderr)

        result = build_result(
            target=target,
            targets=targets,
            config=config,
            baseline="dense",
            counts=counts,
            measurement=ours,
            tokenizer=tokenizer.description,
        )
        (out / "loadtest_result.json").write_text(json.dumps(result, indent=2))
        write_report(result, out / "report")

        agreement = {}
        for model in targets:
            agreement[model] = {}
            for key in COMPARED_KEYS:
                # Ratio per round (the two tools ran back to back), then the geometric mean.
                per_round = [
                    mine[key] / vllm[key]
                    for mine, vllm in zip(result["models"][model]["rounds"], theirs[model])
                    if vllm.get(key)
                ]
                agreement[model][key] = geometric_mean(per_round)
        vllm_speedup = geometric_mean(
            [
                v["output_throughput"] / d["output_throughput"]
                for v, d in zip(theirs[variant_name], theirs["dense"])
            ]
        )
        comparison = result["comparison"][variant_name]
        summary = {
            "model": str(model_dir),
            "num_blocks": num_blocks,
            "removed_blocks": removed,
            "target": target,
            "hardware": result["hardware"],
            "settings": result["settings"],
            "ideal_speedup": comparison["ideal_speedup"],
            "loadtest_speedup": comparison["output_throughput_speedup"],
            "fraction_of_ideal_speedup": comparison["fraction_of_ideal_speedup"],
            "fraction_of_ideal_gain": comparison["fraction_of_ideal_gain"],
            "vllm_bench_speedup": vllm_speedup,
            "loadtest_over_vllm_bench": agreement,
            "vllm_bench_rounds": theirs,
            "goal_fraction_met": (comparison["fraction_of_ideal_speedup"] or 0) >= TARGET_FRACTION,
            "agreement_within_15_percent": all(
                abs(ratio - 1) <= AGREEMENT_TOLERANCE
                for per in agreement.values()
                for ratio in per.values()
                if ratio is not None
            ),
        }
        (out / "summary.json").write_text(json.dumps(summary, indent=2))
        print(markdown_report(result))
        print(f"vllm bench serve output-throughput speedup: {vllm_speedup:.3f}")
        print("| model | " + " | ".join(f"{key} ours/vLLM" for key in COMPARED_KEYS) + " |")
        print("|---" * (len(COMPARED_KEYS) + 1) + "|")
        for model, per in agreement.items():
            print(
                f"| {model} | "
                + " | ".join(f"{per[key]:.3f}" if per[key] else "–" for key in COMPARED_KEYS)
                + " |"
            )
        print(
            json.dumps(
                {
                    k: summary[k]
                    for k in (
                        "ideal_speedup",
                        "loadtest_speedup",
                        "fraction_of_ideal_speedup",
                        "fraction_of_ideal_gain",
                        "vllm_bench_speedup",
                        "goal_fraction_met",
                        "agreement_within_15_percent",
                    )
                },
                indent=2,
            )
        )
    finally:
        for process in reversed(processes):
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()


if __name__ == "__main__":
    main()
