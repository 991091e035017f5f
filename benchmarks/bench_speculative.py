"""Benchmark: does a pruned draft speed dense up through vLLM's speculative decoding? (issue 43, item 5)

What it does (every process it starts is stopped at the end):
1. writes the random 16-block Llama and its 12-block variant ``v25`` of :mod:`benchmarks.bench_comparison`
   into ``--out`` (kept for later runs) and registers both in ``--out/registry.db``;
2. ``depthprune serve --variants dense --speculative dense-spec=v25:K`` (two vLLM CPU engines, the second
   holding dense and its draft);
3. checks that greedy completions of ``dense-spec`` equal dense's on a few prompts;
4. runs ``depthprune loadtest --models dense,dense-spec --aa`` (speed-up with its 95 % interval, the A/A
   control, and the acceptance rate and mean accepted length of ``dense-spec``), and prints the figures for
   docs/benchmarks.md with the Leviathan et al. projection (1 - a^(K+1)) / ((1 - a)(K c + 1)).

With ``--registry`` it serves that registry's dense model and ``--draft`` instead (SmolLM2 from a demo
home), and ``--concurrency 1,16`` runs one load test per level (batch 1 is where a draft can pay: decode
reads every weight for one token; at 16 concurrent requests the CPU is compute-bound and verifying K + 1
tokens costs more).

Run (timings only on a quiet machine)::

    heavy --quiet .venv/bin/python -m benchmarks.bench_speculative --out /tmp/bs --k 3
    heavy --quiet .venv/bin/python -m benchmarks.bench_speculative --out /tmp/bs-smollm2 --k 3 \
        --registry sqlite:////tmp/demo/home/registry.db --home /tmp/demo/home --draft ppl-best \
        --concurrency 1,16
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import httpx

from benchmarks.bench_comparison import NUM_BLOCKS, REMOVED, write_models
from depthprune.testing.servers import running_gateway

PROMPTS = ["w5 w6 w7", "w100 w17 w42 w9", "w200", "w33 w33 w33 w33 w33", "w64 w65 w66 w67 w68 w69"]
LOADTEST_ARGS = ["--aa", "--input-len", "64", "--output-len", "64"]


def register(out: Path, dense: Path, variant: Path) -> str:
    """Step 1: a registry at ``out/registry.db`` holding dense and ``v25``; its URL."""
    from depthprune.testing.variants import register_example_base, register_example_variant
    from ground.core.checksums import weights_sha256
    from registry import open_registry

    url = f"sqlite:///{out / 'registry.db'}"
    with open_registry(url) as registry:
        if not registry.list_variants():
            register_example_base(
                registry, str(dense), weights_sha256=weights_sha256(dense), num_blocks=NUM_BLOCKS
            )
            register_example_variant(
                registry, REMOVED, base_model=str(dense), checkpoint=variant, alias="v25"
            )
    return url


def leviathan(alpha: float, k: int, cost: float) -> float:
    """Expected speed-up of speculative decoding: (1 - a^(K+1)) / ((1 - a)(K c + 1))."""
    if alpha >= 1:
        return (k + 1) / (k * cost + 1)
    return (1 - alpha ** (k + 1)) / ((1 - alpha) * (k * cost + 1))


def greedy_equal(url: str) -> list[bool]:
    """Step 3: for each prompt, whether dense-spec's greedy tokens equal dense's."""
    equal = []
    with httpx.Client(base_url=url, timeout=300) as client:
        for prompt in PROMPTS:
            body = dict(prompt=prompt, max_tokens=32, temperature=0, ignore_eos=True, logprobs=0)
            tokens = [
                client.post("/v1/completions", json={**body, "model": model}).json()["choices"][0][
                    "logprobs"
                ]["tokens"]
                for model in ("dense", "dense-spec")
            ]
            equal.append(tokens[0] == tokens[1])
    return equal


def draft_cost(registry_url: str, draft: str) -> float:
    """The draft's cost relative to dense counted in blocks, (N - M) / N: a GPU's memory-bound decode."""
    from registry import open_registry

    with open_registry(registry_url) as registry:
        info = registry.resolve(draft)
    return (info.num_blocks - len(info.removed_blocks)) / info.num_blocks


def measure(args, gateway_url: str, concurrency: int | None) -> dict:
    """One ``loadtest --models dense,dense-spec --aa`` (all requests at once, or at most ``concurrency``)."""
    tag = f"k{args.k}" + ("" if concurrency is None else f"-c{concurrency}")
    result_file = args.out / f"loadtest-{tag}.json"
    command = [sys.executable, "-m", "depthprune", "loadtest", "--target", gateway_url]
    command += ["--models", "dense,dense-spec", "--num-prompts", str(args.num_prompts), *LOADTEST_ARGS]
    command += args.loadtest_arg
    if concurrency is not None:
        command += ["--max-concurrency", str(concurrency)]
    command += ["--no-save-registry", "--save-result", str(result_file)]
    completed = subprocess.run(command, stdout=subprocess.PIPE, text=True)
    (args.out / f"loadtest-{tag}.md").write_text(completed.stdout)
    if completed.returncode != 0:
        raise SystemExit(f"loadtest failed (exit {completed.returncode})")
    print(completed.stdout)
    result = json.loads(result_file.read_text())
    spec, comparison, aa = (
        result["speculative"]["dense-spec"],
        result["comparison"]["dense-spec"],
        result["aa"],
    )
    return {
        "concurrency": concurrency or args.num_prompts,
        "acceptance_rate": spec["acceptance_rate"],
        "mean_accepted_length": spec["mean_accepted_length"],
        "speedup": comparison["output_throughput_speedup"],
        "speedup_ci95": comparison["output_throughput_speedup_ci95"],
        "aa": aa["output_throughput_ratio"],
        "aa_ci95": aa["output_throughput_ratio_ci95"],
        "tpot_ratio": comparison["ratios"].get("mean_tpot_ms"),
        "tpot_ratio_ci95": comparison["ratios_ci95"].get("mean_tpot_ms"),
        "rounds": result.get("rounds"),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="directory for the models, logs and results")
    parser.add_argument("--k", type=int, default=3, help="drafted tokens per step")
    parser.add_argument(
        "--registry",
        help="serve dense and --draft from this registry (e.g. a demo home's sqlite:///HOME/registry.db) "
        "instead of the 16-block test model and its 12-block variant",
    )
    parser.add_argument("--draft", default="v25", help="the draft variant (name or alias)")
    parser.add_argument("--home", type=Path, help="DEPTHPRUNE_HOME of --registry (default: --out)")
    parser.add_argument(
        "--concurrency",
        default="all",
        help="comma-separated most requests in flight, one load test each; 'all' = all at once",
    )
    parser.add_argument("--num-prompts", type=int, default=16, help="measured requests per model and round")
    parser.add_argument("--loadtest-arg", action="append", default=[], help="extra loadtest option")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.registry is None:
        dense, variant = write_models(args.out)
        registry_url = register(args.out, dense, variant)
    else:
        registry_url = args.registry
    levels = [None if part == "all" else int(part) for part in args.concurrency.split(",")]
    options = ["--registry", registry_url, "--speculative", f"dense-spec={args.draft}:{args.k}"]
    options += ["--max-model-len", "512", "--gpu-memory-utilization", "0.25", "--start-timeout", "900"]
    options += ["--log-level", "warning"]
    env = {"DEPTHPRUNE_HOME": str(args.home or args.out)}
    with running_gateway("dense", args.out / "serve.log", *options, env=env, timeout_s=900) as gateway:
        equal = greedy_equal(gateway.url)
        measured = [measure(args, gateway.url, level) for level in levels]
    cost = draft_cost(registry_url, args.draft)
    for row in measured:
        row["leviathan_projection"] = leviathan(row["acceptance_rate"] or 0.0, args.k, cost)
    summary = {"k": args.k, "draft": args.draft, "greedy_equal": equal, "draft_cost_blocks": cost}
    summary["measured"] = measured
    (args.out / f"summary-k{args.k}.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
