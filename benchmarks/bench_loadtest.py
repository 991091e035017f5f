"""Benchmark: does a variant with 25 % of its blocks removed reach the ideal N/(N-M) throughput speedup
when served, and does ``depthprune loadtest`` agree with ``vllm bench serve`` on the same backend?

What it does (every process it starts is stopped at the end):
1. takes the demo model (``ground.demo.model.ensure_demo_model()``) or ``--model DIR``;
2. writes a variant without round(N/4) evenly spread blocks
   (``pruning.model.checkpoint.write_pruned_checkpoint``), or serves the checkpoints given as ``--variant
   NAME=DIR`` (e.g. a searched variant and its healed child);
3. starts one vLLM CPU server per model with identical settings, and the depthprune gateway in front
   (``depthprune serve --variants dense=URL,v25=URL``; ``--direct`` skips the gateway);
4. in each of ``--rounds`` rounds, measures every model at saturation (all requests at once) with the
   ``loadtest`` package, then with ``vllm bench serve`` (``vllm.benchmarks.serve``; ``--no-vllm-bench``
   skips it) on the same prompts, so the two tools and the models are interleaved and drift cancels;
5. writes ``summary.json``, the load-test result and report (Markdown + PNG) into ``--out``, and prints the
   Markdown for docs/benchmarks.md.

Run: ``.venv/bin/python -m benchmarks.bench_loadtest --out /tmp/bench-loadtest`` (about 5-10 minutes here).
The real model: ``--model DEPTHPRUNE_HOME/models/gguf-<sha>`` (the converted SmolLM2-135M) and
``--variant v27=DIR --variant v27-healed=DIR``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from depthprune.testing.servers import (
    free_port,
    gateway_command,
    start_logged,
    stop,
    vllm_command,
    wait_until_up,
)
from ground.demo.paths import data_file
from loadtest.benchmark import Benchmark, Measurement, build_result, run
from loadtest.compare import BlockCounts, geometric_mean
from loadtest.config import LoadConfig
from loadtest.prompts import HFTokenizer, Prompt, build_prompts
from loadtest.report import markdown_report, write_report

COMPARED_KEYS = (
    "output_throughput",
    "request_throughput",
    "mean_ttft_ms",
    "mean_tpot_ms",
    "mean_itl_ms",
    "mean_e2el_ms",
)
VARIANT_KEYS = (
    "ideal_speedup",
    "output_throughput_speedup",
    "fraction_of_ideal_speedup",
    "fraction_of_ideal_gain",
)
"""Per variant, from the load-test result's comparison with dense."""
AGREEMENT_TOLERANCE = 0.15
TARGET_FRACTION = 0.9


def vllm_server(model_dir: Path, name: str, args, out: Path) -> tuple[subprocess.Popen, str]:
    """Start one vLLM CPU server for ``model_dir`` served as ``name``; wait until it is healthy."""
    port = free_port()
    log = out / f"vllm-{name}.log"
    command = vllm_command(
        model_dir,
        [name],
        port,
        dtype=args.dtype,
        max_model_len=args.max_model_len,
        # Eager (no torch.compile): a real model's engine starts in about 1 min here instead of 2.5.
        extra_args=["--enforce-eager"] if args.eager else [],
    )
    process = start_logged(command, log, env={"VLLM_CPU_KVCACHE_SPACE": str(args.kv_cache_gib)})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(url + "/health", process, log)
    except RuntimeError:
        stop(process)
        raise
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


@dataclass
class ServedVariant:
    """A pruned checkpoint served beside the dense model."""

    name: str
    """Served model name (``v25`` for the evenly spread variant the benchmark writes)."""
    directory: Path
    """Its checkpoint directory."""
    removed: list[int]
    """The blocks it lacks."""


@dataclass
class BenchModels:
    """The dense model and the variants served beside it, with the block counts of each."""

    model_dir: Path
    """Directory of the dense model."""
    num_blocks: int
    """N, its number of blocks."""
    variants: list[ServedVariant]
    """The variants, the headline one first."""

    @property
    def variant_name(self) -> str:
        """Served name of the headline variant."""
        return self.variants[0].name

    @property
    def removed(self) -> list[int]:
        """The blocks the headline variant lacks."""
        return self.variants[0].removed

    def counts(self) -> dict[str, BlockCounts]:
        """``model -> BlockCounts`` for the load-test result."""
        counts = {"dense": BlockCounts(self.num_blocks, 0, "bench")}
        for variant in self.variants:
            counts[variant.name] = BlockCounts(self.num_blocks, len(variant.removed), "bench")
        return counts


@dataclass
class BenchLoad:
    """The load both tools send: the settings, and the prompts (the measured ones also as a file for vLLM)."""

    config: LoadConfig
    """Load-test settings."""
    tokenizer: HFTokenizer
    """The dense model's tokenizer, which sizes the prompts."""
    warmup: list[Prompt]
    """Unmeasured warm-up prompts."""
    measured: list[Prompt]
    """The prompts of every measured round, for both tools."""
    prompts_file: Path
    """``measured`` as JSON Lines, the custom dataset of ``vllm bench serve``."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The benchmark's command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model",
        help="Dense model directory, a .gguf file or smollm2-135m (the embedded real model, converted once); "
        "default: the demo model.",
    )
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
    parser.add_argument("--eager", action="store_true", help="Start vLLM with --enforce-eager (no compile).")
    parser.add_argument(
        "--target-fraction",
        type=float,
        default=TARGET_FRACTION,
        help="Goal for the headline variant's fraction of the ideal speedup (summary's goal_fraction_met).",
    )
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="Serve this pruned checkpoint as NAME instead of writing an evenly spread variant; repeatable "
        "(the first is the headline variant, e.g. a pruned variant, then its healed child).",
    )
    parser.add_argument(
        "--no-vllm-bench", action="store_true", help="Measure with depthprune loadtest only (half the time)."
    )
    return parser.parse_args(argv)


def named_variant(assignment: str) -> ServedVariant:
    """``NAME=DIR`` of ``--variant`` -> the variant, its removed blocks read from ``DIR/pruning.json``."""
    name, separator, directory = assignment.partition("=")
    if not separator or not name or not directory:
        raise SystemExit(f"--variant takes NAME=DIR, got {assignment!r}")
    path = Path(directory).expanduser().resolve()
    pruning_file = path / "pruning.json"
    if not pruning_file.is_file():
        raise SystemExit(f"--variant {name}: {path} has no pruning.json")
    return ServedVariant(name, path, json.loads(pruning_file.read_text())["removed_blocks"])


def prepare_models(args: argparse.Namespace, out: Path) -> BenchModels:
    """Steps 1-2: the dense model (the demo model unless ``--model``) and its variants: the ``--variant``
    checkpoints, else one written without evenly spread blocks (if missing)."""
    if args.model is None:
        from ground.demo.model import ensure_demo_model

        model_dir = Path(ensure_demo_model())
    else:
        from pruning.model.sources import resolve_model

        model_dir = Path(resolve_model(args.model).model).resolve()
    num_blocks = json.loads((model_dir / "config.json").read_text())["num_hidden_layers"]
    variants = [named_variant(assignment) for assignment in args.variant]
    if not variants:
        removed = removed_blocks_for(num_blocks, args.removed_fraction)
        variant_dir = out / f"v{round(100 * len(removed) / num_blocks)}"
        if not (variant_dir / "pruning.json").is_file():
            from pruning.model.checkpoint import write_pruned_checkpoint

            write_pruned_checkpoint(str(model_dir), removed, variant_dir, overwrite=True)
        variants = [ServedVariant(variant_dir.name, variant_dir, removed)]
    listed = "; ".join(f"{variant.name}: removed {variant.removed}" for variant in variants)
    print(f"dense: {model_dir} ({num_blocks} blocks); {listed}", file=sys.stderr)
    return BenchModels(model_dir, num_blocks, variants)


def start_servers(
    models: BenchModels, args: argparse.Namespace, out: Path, processes: list[subprocess.Popen]
) -> tuple[dict[str, str], str]:
    """Step 3: a vLLM server per model, and the gateway in front unless ``--direct``.

    Every process started is appended to ``processes`` (the caller stops them).

    Returns:
        ``model -> base URL`` the load goes to, and the target as the result reports it.
    """
    urls = {}
    for name, directory in [("dense", models.model_dir)] + [(v.name, v.directory) for v in models.variants]:
        process, urls[name] = vllm_server(directory, name, args, out)
        processes.append(process)
    if args.direct:
        listed = ", ".join(f"{url} ({name})" for name, url in urls.items())
        return dict(urls), f"{listed}: direct"
    port = free_port()
    log = out / "gateway.log"
    variants = ",".join(f"{name}={url}" for name, url in urls.items())
    gateway = start_logged(gateway_command(variants, port), log)
    processes.append(gateway)
    target = f"http://127.0.0.1:{port}"
    wait_until_up(target + "/ready", gateway, log, timeout_s=120)
    return {name: target for name in urls}, target


def prompt_source(model_dir: Path, out: Path) -> str:
    """``--prompts`` of the load: the demo model's test text, else pydoc's test split (held-out English text
    that ships with CPython) written as JSON Lines into ``out``."""
    demo_text = data_file(model_dir, "text_test")
    if demo_text.is_file():
        return str(demo_text)
    from pruning.calibration.data.pydoc import pydoc_documents

    path = out / "prompts-pydoc-test.jsonl"
    lines = [json.dumps({"text": document.text}) + "\n" for document in pydoc_documents("test")]
    path.write_text("".join(lines))
    return str(path)


def prepare_load(model_dir: Path, args: argparse.Namespace, out: Path) -> BenchLoad:
    """The load settings and prompts (:func:`prompt_source`)."""
    config = LoadConfig(
        num_prompts=args.num_prompts,
        input_len=args.input_len,
        output_len=args.output_len,
        warmup=4,
        seed=args.seed,
        rounds=args.rounds,
        prompts=prompt_source(model_dir, out),
    )
    tokenizer = HFTokenizer(model_dir)
    prompts = build_prompts(
        config.prompts, config.warmup + config.num_prompts, config.input_len, tokenizer, seed=config.seed
    )
    warmup, measured = prompts[: config.warmup], prompts[config.warmup :]
    prompts_file = out / "prompts.jsonl"
    prompts_file.write_text("".join(json.dumps({"prompt": p.text}) + "\n" for p in measured))
    return BenchLoad(config, tokenizer, warmup, measured, prompts_file)


def measure_interleaved(
    targets: dict[str, str], load: BenchLoad, model_dir: Path, args: argparse.Namespace
) -> tuple[Measurement, dict[str, list[dict]]]:
    """Step 4: every round measures both models with ``loadtest``, then with ``vllm bench serve``.

    Returns:
        The ``loadtest`` runs of every round, and ``model -> [vllm bench serve result of each round]``.
    """
    benchmark = Benchmark(targets, load.config)
    run(benchmark.warm_up(load.warmup))
    ours = Measurement(rate=math.inf)
    theirs: dict[str, list[dict]] = {model: [] for model in targets}

    def vllm_round(order: list[str]) -> None:
        for model in order:
            theirs[model].append(vllm_bench_serve(targets[model], model, model_dir, load.prompts_file, args))

    if args.no_vllm_bench:
        # One call for every round: the load test alternates the models' order from round to round.
        return run(benchmark.measure([load.measured] * args.rounds)), theirs
    for round_index in range(args.rounds):
        # Alternate which tool goes first (and the model order of vLLM's runs): drift hits both alike.
        order = list(targets) if round_index % 2 == 0 else list(targets)[::-1]
        if round_index % 2 == 1:
            vllm_round(order)
        step = run(benchmark.measure([load.measured]))
        for one_run in step.runs:
            one_run.round = round_index
        ours.runs.extend(step.runs)
        if round_index % 2 == 0:
            vllm_round(order)
        print(f"round {round_index + 1}/{args.rounds} done", file=sys.stderr)
    return ours, theirs


def tool_agreement(result: dict, theirs: dict[str, list[dict]]) -> dict[str, dict[str, float | None]]:
    """``model -> {metric: loadtest / vllm bench serve}``, the geometric mean of the per-round ratios."""
    agreement = {}
    for model in theirs:
        agreement[model] = {}
        for key in COMPARED_KEYS:
            # Ratio per round (the two tools ran back to back), then the geometric mean.
            per_round = [
                mine[key] / vllm[key]
                for mine, vllm in zip(result["models"][model]["rounds"], theirs[model])
                if vllm.get(key)
            ]
            agreement[model][key] = geometric_mean(per_round)
    return agreement


def build_summary(
    models: BenchModels,
    target: str,
    result: dict,
    theirs: dict[str, list[dict]],
    target_fraction: float = TARGET_FRACTION,
) -> dict:
    """Step 5: what ``summary.json`` holds: both tools' speedups against the ideal, and how far they agree."""
    agreement = tool_agreement(result, theirs)
    vllm_speedup = geometric_mean(
        [
            v["output_throughput"] / d["output_throughput"]
            for v, d in zip(theirs[models.variant_name], theirs["dense"])
        ]
    )
    comparison = result["comparison"][models.variant_name]
    return {
        "model": str(models.model_dir),
        "num_blocks": models.num_blocks,
        "removed_blocks": models.removed,
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
        "variants": {
            variant.name: {
                "removed_blocks": variant.removed,
                "checkpoint": str(variant.directory),
                **{key: result["comparison"][variant.name][key] for key in VARIANT_KEYS},
            }
            for variant in models.variants
        },
        "target_fraction": target_fraction,
        "goal_fraction_met": (comparison["fraction_of_ideal_speedup"] or 0) >= target_fraction,
        # None when vllm bench serve did not run (--no-vllm-bench): nothing to agree with.
        "agreement_within_15_percent": None
        if vllm_speedup is None
        else all(
            abs(ratio - 1) <= AGREEMENT_TOLERANCE
            for per in agreement.values()
            for ratio in per.values()
            if ratio is not None
        ),
    }


def print_for_docs(result: dict, summary: dict) -> None:
    """The Markdown for docs/benchmarks.md: load-test report, the tools' agreement, the headline numbers."""
    print(markdown_report(result))
    if summary["vllm_bench_speedup"] is not None:
        print(f"vllm bench serve output-throughput speedup: {summary['vllm_bench_speedup']:.3f}")
        print("| model | " + " | ".join(f"{key} ours/vLLM" for key in COMPARED_KEYS) + " |")
        print("|---" * (len(COMPARED_KEYS) + 1) + "|")
        for model, per in summary["loadtest_over_vllm_bench"].items():
            print(
                f"| {model} | "
                + " | ".join(f"{per[key]:.3f}" if per[key] else "–" for key in COMPARED_KEYS)
                + " |"
            )
    headline = (
        "ideal_speedup",
        "loadtest_speedup",
        "fraction_of_ideal_speedup",
        "fraction_of_ideal_gain",
        "vllm_bench_speedup",
        "goal_fraction_met",
        "agreement_within_15_percent",
    )
    print(json.dumps({key: summary[key] for key in headline}, indent=2))
    if len(summary["variants"]) > 1:
        print(json.dumps(summary["variants"], indent=2))


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark (steps in the module docstring); every process it started is stopped at the end."""
    args = parse_args(argv)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    models = prepare_models(args, out)
    processes: list[subprocess.Popen] = []
    try:
        targets, target = start_servers(models, args, out, processes)
        load = prepare_load(models.model_dir, args, out)
        ours, theirs = measure_interleaved(targets, load, models.model_dir, args)
        result = build_result(
            target=target,
            targets=targets,
            config=load.config,
            baseline="dense",
            counts=models.counts(),
            measurement=ours,
            tokenizer=load.tokenizer.description,
        )
        (out / "loadtest_result.json").write_text(json.dumps(result, indent=2))
        write_report(result, out / "report")
        summary = build_summary(models, target, result, theirs, args.target_fraction)
        (out / "summary.json").write_text(json.dumps(summary, indent=2))
        print_for_docs(result, summary)
    finally:
        for process in reversed(processes):
            stop(process)


if __name__ == "__main__":
    main()
