"""Benchmark: is ``depthprune loadtest --aa`` a comparison one can trust? (issue 25's acceptance)

What it does (every process it starts is stopped at the end):
1. writes a random 16-block Llama (hidden 512, the tiny word-level tokenizer) and a variant without 4 evenly
   spread blocks into ``--out`` (kept there for later runs);
2. starts one vLLM CPU server per model (``--vllm-arg`` passes options on, e.g. ``--max-num-seqs 8`` for the
   TTFT study) and the depthprune gateway in front;
3. runs ``depthprune loadtest --aa --num-prompts 32 --input-len 64 --output-len 64`` ``--runs`` times with the
   default workload, rounds and precision (``--loadtest-arg`` adds options);
4. checks the acceptance of every run and across runs, writes ``summary.json`` and prints the Markdown table
   for docs/benchmarks.md.

The checks: the A/A point within 10 % of 1, its interval at most ±10 % wide and reaching into [0.98, 1.02];
the variant's speed-up interval holds its point; TTFT and TPOT ratios carry intervals; the low end of the
fraction-of-ideal interval is <= 1; and the speed-up intervals of all runs overlap.

Run (timings only on a quiet machine; one run takes about 11 minutes with the engines' start, so the two runs
are two invocations, then ``--results`` checks them together)::

    heavy --exclusive .venv/bin/python -m benchmarks.bench_comparison --out /tmp/bc/final1 --runs 1
    heavy --exclusive .venv/bin/python -m benchmarks.bench_comparison --out /tmp/bc/final2 --runs 1
    .venv/bin/python -m benchmarks.bench_comparison --out /tmp/bc --results /tmp/bc/final*/run0.json

The TTFT study in docs/benchmarks.md used ``--runs 1 --loadtest-arg=--rounds --loadtest-arg=8`` (and
``--max-rounds 8``, ``--steady-fraction 0``) with ``--vllm-arg=--max-num-batched-tokens --vllm-arg=N``,
``--vllm-arg=--max-num-seqs --vllm-arg=8``, ``--direct`` or ``--pin-http``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from depthprune.testing.servers import free_port, gateway_command, running, vllm_command

NUM_BLOCKS = 16
REMOVED = [2, 6, 10, 14]
"""4 of 16 blocks, evenly spread (which ones does not change the speed)."""
LOADTEST_ARGS = ["--aa", "--num-prompts", "32", "--input-len", "64", "--output-len", "64"]
"""The acceptance's command line (after --target/--models/--blocks)."""


def write_models(out: Path) -> tuple[Path, Path]:
    """Step 1: the random dense model and its 4-of-16 variant (written once, reused)."""
    dense, variant = out / "dense", out / "v25"
    if not (dense / "config.json").is_file():
        import torch
        from transformers import AutoModelForCausalLM, LlamaConfig

        from depthprune.testing.models import tiny_tokenizer

        torch.manual_seed(0)
        config = LlamaConfig(
            vocab_size=256,
            hidden_size=512,
            intermediate_size=1536,
            num_hidden_layers=NUM_BLOCKS,
            num_attention_heads=8,
            num_key_value_heads=4,
            head_dim=64,
            max_position_embeddings=512,
        )
        AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(dense)
        tiny_tokenizer().save_pretrained(dense)
    if not (variant / "pruning.json").is_file():
        from pruning.model.checkpoint import write_pruned_checkpoint

        write_pruned_checkpoint(str(dense), REMOVED, variant, overwrite=True)
    return dense, variant


def loadtest_run(target: str, models: str, out: Path, index: int, extra: list[str], pin: list[str]) -> dict:
    """Step 3: one ``depthprune loadtest`` run; its saved result plus the command and wall time."""
    result_file = out / f"run{index}.json"
    command = [*pin, sys.executable, "-m", "depthprune", "loadtest", "--target", target, "--models", models]
    command += ["--blocks", f"dense={NUM_BLOCKS}:0,v25={NUM_BLOCKS}:{len(REMOVED)}", *LOADTEST_ARGS, *extra]
    command += ["--no-save-registry", "--save-result", str(result_file)]
    started = time.monotonic()
    completed = subprocess.run(command, stdout=subprocess.PIPE, text=True)
    if completed.returncode != 0:
        raise SystemExit(f"loadtest run {index} failed (exit {completed.returncode})")
    (out / f"run{index}.md").write_text(completed.stdout)
    result = json.loads(result_file.read_text())
    shown = command[command.index("-m") + 1 :]
    result["bench"] = {"command": " ".join(shown), "wall_s": time.monotonic() - started}
    result_file.write_text(json.dumps(result, indent=2))
    return result


def run_checks(result: dict) -> dict[str, bool]:
    """The acceptance checks of one run."""
    aa, variant = result["aa"], result["comparison"]["v25"]
    aa_low, aa_high = aa["output_throughput_ratio_ci95"]
    low, high = variant["output_throughput_speedup_ci95"]
    ratios = variant["ratios_ci95"]
    steady_ratios = result.get("steady", {}).get("comparison", {}).get("v25", {}).get("ratios_ci95", {})
    return {
        "aa_point_within_10pct": abs(aa["output_throughput_ratio"] - 1) <= 0.10,
        "aa_interval_within_10pct": aa_high / aa["output_throughput_ratio"] <= 1.10
        and aa["output_throughput_ratio"] / aa_low <= 1.10,
        "aa_interval_reaches_0.98_1.02": aa_low <= 1.02 and aa_high >= 0.98,
        "speedup_interval_holds_point": low <= variant["output_throughput_speedup"] <= high,
        "ttft_tpot_intervals": all(ratios.get(key) for key in ("mean_ttft_ms", "mean_tpot_ms"))
        and all(steady_ratios.get(key) for key in ("mean_ttft_ms", "mean_tpot_ms")),
        "fraction_of_ideal_low_le_1": variant["fraction_of_ideal_speedup_ci95"][0] <= 1.0,
    }


def row(result: dict) -> dict:
    """The figures docs/benchmarks.md shows of one run."""
    aa, variant = result["aa"], result["comparison"]["v25"]
    steady = result.get("steady") or {}
    steady_v = steady.get("comparison", {}).get("v25", {})
    steady_aa = steady.get("aa") or {}

    def interval(point, ci, suffix=""):
        return f"{point:.3f}{suffix} [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else f"{point:.3f}{suffix}"

    return {
        "rounds (saturation / steady)": f"{result['rounds']} / {steady.get('rounds', '–')}",
        "wall s": f"{result['bench']['wall_s']:.0f}",
        "A/A throughput": interval(aa["output_throughput_ratio"], aa["output_throughput_ratio_ci95"], "x"),
        "v25 speed-up": interval(
            variant["output_throughput_speedup"], variant["output_throughput_speedup_ci95"], "x"
        ),
        "fraction of ideal": interval(
            variant["fraction_of_ideal_speedup"], variant["fraction_of_ideal_speedup_ci95"]
        ),
        "TTFT ratio (sat.)": interval(
            variant["ratios"]["mean_ttft_ms"], variant["ratios_ci95"]["mean_ttft_ms"]
        ),
        "TPOT ratio (sat.)": interval(
            variant["ratios"]["mean_tpot_ms"], variant["ratios_ci95"]["mean_tpot_ms"]
        ),
        "steady rate req/s": f"{steady['rate']:.2f}" if steady else "–",
        "TTFT ratio (steady)": interval(
            steady_v["ratios"]["mean_ttft_ms"], steady_v["ratios_ci95"]["mean_ttft_ms"]
        )
        if steady_v
        else "–",
        "TPOT ratio (steady)": interval(
            steady_v["ratios"]["mean_tpot_ms"], steady_v["ratios_ci95"]["mean_tpot_ms"]
        )
        if steady_v
        else "–",
        "A/A TPOT (steady)": interval(steady_aa["mean_tpot_ms_ratio"], steady_aa["mean_tpot_ms_ratio_ci95"])
        if steady_aa
        else "–",
        "dense TTFT sd across rounds (ms)": f"{_round_sd(result, 'dense', 'mean_ttft_ms'):.0f}",
        "A/A per-round sd of log ratio": f"{_log_ratio_sd(result):.3f}",
    }


def _round_sd(result: dict, model: str, key: str) -> float:
    import statistics

    values = [metrics[key] for metrics in result["models"][model]["rounds"]]
    return statistics.stdev(values) if len(values) > 1 else 0.0


def _log_ratio_sd(result: dict) -> float:
    import math
    import statistics

    base = result["models"]["dense"]["rounds"]
    twin = result["models"]["dense (A/A)"]["rounds"]
    logs = [math.log(t["output_throughput"] / b["output_throughput"]) for t, b in zip(twin, base)]
    return statistics.stdev(logs) if len(logs) > 1 else 0.0


def overlap(intervals: list[list[float]]) -> bool:
    """Whether every pair of intervals overlaps (they then share a point pairwise)."""
    return max(low for low, _ in intervals) <= min(high for _, high in intervals)


def print_for_docs(results: list[dict], summary: dict) -> None:
    """One column per run, one row per figure, then the checks."""
    rows = [row(result) for result in results]
    print("| figure | " + " | ".join(f"run {i + 1}" for i in range(len(rows))) + " |")
    print("|---" * (len(rows) + 1) + "|")
    for key in rows[0]:
        print(f"| {key} | " + " | ".join(r[key] for r in rows) + " |")
    print()
    print(
        json.dumps({"checks": summary["checks"], "speedup_intervals_overlap": summary["overlap"]}, indent=2)
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("bench-comparison"))
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--kv-cache-gib", type=int, default=1)
    parser.add_argument("--vllm-arg", action="append", default=[], help="Passed to both vLLM servers.")
    parser.add_argument("--loadtest-arg", action="append", default=[], help="Passed to every loadtest run.")
    parser.add_argument(
        "--results",
        type=Path,
        nargs="+",
        help="Only summarize these runs' result files (runs made by separate invocations).",
    )
    parser.add_argument("--direct", action="store_true", help="Load the vLLM servers, not the gateway.")
    parser.add_argument(
        "--pin-http",
        action="store_true",
        help="Hold the HTTP side (vLLM API servers, gateway, load generator) to CPU 1, the engines to CPU 0.",
    )
    return parser.parse_args(argv)


def summarize(results: list[dict], out: Path, extra: dict) -> None:
    """Step 4: checks of each run and across runs into ``summary.json``, and the table for the docs."""
    summary = {
        **extra,
        "hardware": results[0]["hardware"],
        "commands": [result["bench"]["command"] for result in results],
        "checks": [run_checks(result) for result in results],
        "overlap": overlap([r["comparison"]["v25"]["output_throughput_speedup_ci95"] for r in results]),
        "rows": [row(result) for result in results],
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print_for_docs(results, summary)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    if args.results:
        summarize(
            [json.loads(path.read_text()) for path in args.results],
            out,
            {"results": list(map(str, args.results))},
        )
        return
    dense, variant = write_models(out)
    env = {"VLLM_CPU_KVCACHE_SPACE": str(args.kv_cache_gib)}
    # vLLM's CPU engine binds its one compute thread to CPU 0 and keeps CPU 1 for the rest ("auto"); with
    # --pin-http the API servers, the gateway and the load generator are held to CPU 1 as well.
    pin = ["taskset", "-c", "1"] if args.pin_http else []
    if args.pin_http:
        env["VLLM_CPU_OMP_THREADS_BIND"] = "0"
    vllm_args = ["--enforce-eager", *args.vllm_arg]
    ports = {"dense": free_port(), "v25": free_port(), "gateway": free_port()}
    urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}

    def engine(name: str, directory: Path):
        command = vllm_command(directory, [name], ports[name], dtype="bfloat16", max_model_len=512)
        return running([*pin, *command, *vllm_args], urls[name], out / f"vllm-{name}.log", env=env)

    started = time.monotonic()
    gateway = gateway_command(f"dense={urls['dense']},v25={urls['v25']}", ports["gateway"])
    with (
        engine("dense", dense),
        engine("v25", variant),
        running([*pin, *gateway], urls["gateway"], out / "gateway.log", health="/ready", timeout_s=120),
    ):
        print(f"servers up in {time.monotonic() - started:.0f} s", file=sys.stderr)
        target, models = urls["gateway"], "dense,v25"
        if args.direct:
            target, models = urls["dense"], f"dense,v25@{urls['v25']}"
        results = [loadtest_run(target, models, out, i, args.loadtest_arg, pin) for i in range(args.runs)]
    summarize(results, out, {"vllm_args": vllm_args, "pin_http": args.pin_http})


if __name__ == "__main__":
    main()
