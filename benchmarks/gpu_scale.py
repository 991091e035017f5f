"""Search time and peak memory at 8B scale on one GPU, with no download: the study's Table 4 workload.

A model of Llama-3.1-8B's shape (its public config, shipped in the testing kit) is built directly on the
card in bfloat16 with random weights, and scored on random calibration tokens: the time and memory of a
forward pass do not depend on the weights' values or on which tokens are fed, so this measures what ``prune``
would spend on the real model and C4 (search *outcomes* would differ; their cost does not). The steps:

1. the memory planner's prediction for each size (``plan_prune``, as ``prune --dry-run`` prints it), before
   any weight exists;
2. ``one_shot`` and ``greedy`` at M = 7 through the real search code (``run_standalone``: a fresh exact subset
   evaluator per search, with its shortcuts, as ``prune --timing standalone`` runs them, the accounting of
   Table 4) at several calibration sizes (``--samples``, default 4, 8 and 16 windows of 2,048 tokens), so that
   the cost's scaling in tokens is measured, not assumed; the paper's 64 x 2,048 is extrapolated from the two
   largest (a line through both points) unless it is one of them. A size whose searches, projected from the
   last one, would end past ``--budget-seconds`` is skipped and named (a lease is short);
3. ``torch.cuda.max_memory_allocated`` during each search (reset before it) against the plan's peak, with the
   evaluator's boundary cache and the most its search states held;
4. where one evaluation's time goes (``benchmarks.gpu_profile``): per block and the rest, and the profiler's
   operator table beside the result.

It writes ``docs/gpu-results/scale.json`` (``device``, ``model_shape``, ``searches.<name>`` with seconds,
samples, seq_len, block-forwards, tokens, achieved TFLOP/s per size, ``greedy_seconds_at_paper_size``,
``peak_gib_planned``, ``peak_gib_measured``, ``profile``, the git commit) and prints each size's seconds.

    python -m benchmarks.gpu_scale                      # one H100/H200, about 5 minutes after start-up
    python -m benchmarks.gpu_scale --samples 16,64      # the paper's size measured directly (longer)
    python -m benchmarks.gpu_scale --smoke --out /tmp/scale.json   # a tiny shape on the CPU (the test suite)

FLOPs counted per block call: 2 x the block's parameters x its token positions, plus 4 x seq_len² x hidden
per sequence for attention's two matrix products (causal masking not discounted), plus 2 x hidden x vocab per
position through the LM head. Achieved TFLOP/s is that over the search's wall time.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import time
from pathlib import Path

from depthprune.testing.public_configs import public_config
from ground.core.files import write_text_atomically
from ground.planning import CalibrationSizes, plan_devices, plan_prune
from ground.planning.parameters import count_parameters
from ground.planning.shape import model_shape

PAPER_SAMPLES, PAPER_SEQ_LEN, PAPER_DROP = 64, 2048, 7
"""The study's calibration (64 windows of 2,048 tokens) and Table 4's budget."""
A40_SECONDS = {"one_shot": 551, "greedy": 3223}
"""The study's Table 4 (LLaMA3-8B, M = 7, one A40): search seconds."""
SEARCHES = ("one_shot", "greedy")
LLAMA_8B = "meta-llama/Llama-3.1-8B"
"""The model of Table 4, by its hub id (its public config ships with the testing kit)."""
BF16_PEAK_TFLOPS = {
    "H100 PCIe": 756.0,
    "H100": 989.0,
    "H200": 989.0,
    "A100": 312.0,
    "A40": 149.7,
    "L40S": 362.0,
}
"""Dense bf16 tensor-core peak per card (vendor data sheets, without sparsity); the first name found in the
device's name is used (``H100 PCIe`` before ``H100``)."""
SMOKE = dict(config="tiny", device="cpu", dtype="float32", samples=(2, 4), seq_len=32, drop=2)
GIB = 2**30


def model_config(name: str) -> dict:
    """The config of the model measured: Llama-3.1-8B's public one, or the testing kit's tiny Llama."""
    if name != "tiny":
        return public_config(name)
    from depthprune.testing.models import tiny_config

    return tiny_config("llama").to_dict()


def build_model(config: dict, device: str, dtype: str):
    """A randomly initialised causal LM of ``config``'s shape, built directly on ``device`` in ``dtype``."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = {key: value for key, value in config.items() if key not in ("model_type", "architectures")}
    hf_config = AutoConfig.for_model(config["model_type"], **fields)
    hf_config._attn_implementation = "sdpa"  # the planner assumes fused attention (no seq_len² scores)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(getattr(torch, dtype))
    try:
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(hf_config)
    finally:
        torch.set_default_dtype(previous)
    return model.eval()


def random_evaluator(stack, samples: int, seq_len: int, args, sizes: dict, fused: bool | str = False):
    """A fresh exact subset evaluator (perplexity) over ``samples`` random windows of ``seq_len`` tokens
    (``fused``: its blocks through one compiled forward, ``SubsetEvaluator``'s ``fused_blocks``)."""
    import torch

    from pruning.calibration.config import CalibrationConfig
    from pruning.calibration.data.items import TextSamples
    from pruning.calibration.objectives.batches import make_batches
    from pruning.calibration.scoring.evaluator import SubsetEvaluator

    generator = torch.Generator().manual_seed(args.seed)
    vocab = stack.config.vocab_size
    tokens = torch.randint(0, vocab, (samples, seq_len), generator=generator).tolist()
    batches = make_batches(TextSamples(tokens, "random tokens"), None, seq_len, sizes["calibration_batch"])
    # The configuration is recorded, never loaded: the tokens above stand in for C4's.
    config = CalibrationConfig("perplexity", "c4", samples=samples, seq_len=seq_len)
    return SubsetEvaluator(
        stack,
        config,
        batches,
        model_id="random",
        dtype=args.dtype,
        memory_budget_gb=sizes["memory_budget_gb"],
        progress=False,
        fused_blocks=fused,
    )


def block_flops(shape, tokens: int, seq_len: int) -> float:
    """FLOPs of block calls over ``tokens`` token positions in windows of ``seq_len`` (module docstring)."""
    blocks = count_parameters(shape).blocks
    per_block = sum(blocks) / len(blocks)
    sequences = tokens / max(seq_len, 1)
    return 2.0 * per_block * tokens + 4.0 * seq_len * seq_len * shape.hidden_size * sequences


def flops(shape, stats, seq_len: int) -> float:
    """FLOPs of the block calls and LM-head positions an evaluator counted (module docstring)."""
    head = 2.0 * shape.hidden_size * shape.vocab_size * stats.head_positions
    return block_flops(shape, stats.tokens, seq_len) + head


def plan(config: dict, name: str, device: str, dtype: str, samples: int, seq_len: int):
    """The memory planner's plan of ``prune`` for this run (what ``--dry-run`` prints)."""
    # each search on a fresh evaluator, as measured (prune --timing standalone)
    sizes = CalibrationSizes(samples=samples, seq_len=seq_len, searches=SEARCHES, shared_evaluator=False)
    return plan_prune(config, name, dtype, plan_devices(device), sizes)


def measure(
    stack, shape, args, samples: int, sizes: dict, searches=SEARCHES, fused=False, on_evaluator=None
) -> dict:
    """Each search alone on a fresh evaluator at one calibration size: seconds, work and FLOP/s.

    ``fused`` is the evaluator's ``fused_blocks``; ``on_evaluator(run, evaluator)`` sees each search's
    evaluator after it ran (outside its clock)."""
    import torch

    from pruning.pipeline.prune import run_standalone

    made = []

    def cold_evaluator():
        made.clear()  # drop the previous evaluator's boundary cache before the next one fills its own
        release_memory(args.device)
        if args.device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats(torch.device(args.device))
        made.append(random_evaluator(stack, samples, args.seq_len, args, sizes, fused))
        return made[0]

    results = {}

    def record(run) -> None:
        stats = made[0].stats
        work = flops(shape, stats, args.seq_len)
        results[run.search] = {
            "samples": samples,
            "seq_len": args.seq_len,
            "seconds": round(run.seconds, 3),
            "block_forwards": run.block_forwards,
            "tokens": stats.tokens,
            "tflop": float(f"{work / 1e12:.4g}"),
            "achieved_tflops": float(f"{work / 1e12 / max(run.seconds, 1e-9):.4g}"),
            "removed_blocks": list(run.result.removed_blocks),
            "loss": run.result.loss,
            # what the card held at the search's peak, and the evaluator's caches in it
            "peak_gib": gib(torch.cuda.max_memory_allocated(torch.device(args.device)))
            if args.device.startswith("cuda")
            else None,
            "boundary_cache_gib": gib(made[0].cache_bytes),
            "search_states_gib_most": gib(made[0].search_state_bytes_most),
        }
        if on_evaluator is not None:
            on_evaluator(run, made[0])

    run_standalone(cold_evaluator, args.drop, searches, seed=args.seed, progress=False, on_run=record)
    made.clear()
    return results


def profile_at(stack, shape, args, samples: int, sizes: dict) -> dict:
    """Where one evaluation's time goes at ``samples`` windows (``benchmarks.gpu_profile``); the profiler's
    operator table is written beside the result (``<out>.profile.txt``)."""
    from benchmarks.gpu_profile import profile_evaluation

    release_memory(args.device)
    evaluator = random_evaluator(stack, samples, args.seq_len, args, sizes)
    split, table = profile_evaluation(
        evaluator, args.device, block_flops(shape, samples * args.seq_len, args.seq_len)
    )
    del evaluator
    release_memory(args.device)
    table_path = args.out.with_suffix(".profile.txt")
    write_beside(table_path, table + "\n")
    split["samples"] = samples
    split["operator_table"] = table_path.name
    print(
        f"one evaluation at {samples} x {args.seq_len}: {split['per_block_seconds'] * 1e3:.2f} ms per block "
        f"({split['block_tflops']:.1f} TFLOP/s), {split['fixed_seconds'] * 1e3:.1f} ms the rest"
    )
    return split


def gib(count: int) -> float:
    return round(count / GIB, 2)


def release_memory(device: str) -> None:
    import gc

    import torch

    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def planned_sizes(memory_plan, device: str) -> dict:
    """The sizes ``prune`` takes from the plan on a GPU (calibration batch, boundary-cache budget); on the CPU
    its defaults, as ``prune`` keeps them there."""
    if device.startswith("cuda"):
        return {key: memory_plan.choices[key] for key in ("calibration_batch", "memory_budget_gb")}
    return {"calibration_batch": 8, "memory_budget_gb": None}


def at_paper_size(points: list[dict]) -> float | None:
    """Seconds at 64 samples: measured when it was run, else the line through the two sizes measured."""
    by_samples = {point["samples"]: point["seconds"] for point in points}
    if PAPER_SAMPLES in by_samples:
        return by_samples[PAPER_SAMPLES]
    if len(by_samples) < 2:
        return None
    (s1, t1), (s2, t2) = sorted(by_samples.items())[-2:]
    return round(t1 + (t2 - t1) * (PAPER_SAMPLES - s1) / (s2 - s1), 1)


def git_commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def device_name(device: str) -> str:
    import torch

    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    import platform

    return f"CPU ({platform.processor() or platform.machine()})"


def peak_tflops(name: str) -> float | None:
    for card, tflops in BF16_PEAK_TFLOPS.items():
        if card in name:
            return tflops
    return None


def run(args) -> dict:
    """The whole measurement; returns what is written to ``args.out``. After each calibration size the record
    so far is written (``"complete": false``), so a run stopped by its lease keeps what it measured."""

    config = model_config(args.config)
    shape = model_shape(config)
    plans = {
        samples: plan(config, args.config, args.device, args.dtype, samples, args.seq_len)
        for samples in args.samples
    }
    largest = plans[max(args.samples)]
    print(
        f"plan at {max(args.samples)} x {args.seq_len}: peak {largest.peak_bytes / GIB:.2f} GiB, "
        + ("fits" if largest.fits else largest.one_line())
    )
    started = time.perf_counter()
    from pruning.model.blocks import BlockStack

    stack = BlockStack(build_model(config, args.device, args.dtype))
    name = device_name(args.device)
    record = {
        "device": name,
        "bf16_peak_tflops": peak_tflops(name),
        "model": args.config,
        "model_shape": dataclasses.asdict(shape),
        "dtype": args.dtype,
        "drop": args.drop,
        "weights": "random (same shape; time and memory do not depend on the values)",
        "calibration": "random token ids (same count; stands in for C4)",
        "model_build_seconds": round(time.perf_counter() - started, 1),
        "budget_seconds": args.budget_seconds,
        "skipped_samples": [],
        "searches": {name: {"sizes": []} for name in SEARCHES},
        "git_commit": args.commit or git_commit(),
        "complete": False,
    }
    searches = record["searches"]
    for samples in args.samples:
        projected = projected_seconds(searches, samples)
        if projected is not None and time.perf_counter() - started + projected > args.budget_seconds:
            print(
                f"skipped {samples} x {args.seq_len}: its searches would take about {projected:.0f} s, "
                f"past --budget-seconds {args.budget_seconds:.0f}"
            )
            record["skipped_samples"].append(samples)
            continue
        sizes = planned_sizes(plans[samples], args.device)
        for search, point in measure(stack, shape, args, samples, sizes).items():
            searches[search]["sizes"].append(point)
            print(
                f"{search:9s} {samples:3d} x {args.seq_len}: {point['seconds']:8.1f} s, "
                f"{point['achieved_tflops']:7.1f} TFLOP/s"
            )
        write_record(args.out, record)
    measured_samples = [point["samples"] for point in searches[SEARCHES[0]]["sizes"]]
    smallest = min(measured_samples)
    record["profile"] = profile_at(stack, shape, args, smallest, planned_sizes(plans[smallest], args.device))
    for search, entry in searches.items():
        entry.update(entry["sizes"][-1])  # the largest size measured is the headline
        entry["seconds_at_paper_size"] = at_paper_size(entry["sizes"])
        entry["a40_seconds"] = (
            A40_SECONDS[search] if args.config == LLAMA_8B and args.drop == PAPER_DROP else None
        )
    largest_plan = plans[max(measured_samples)]
    peaks = [entry["peak_gib"] for entry in searches.values() if entry["peak_gib"] is not None]
    record.update(
        greedy_seconds_at_paper_size=searches["greedy"]["seconds_at_paper_size"],
        # the planner's peak for the largest size measured against the most a search held there
        peak_gib_planned=gib(largest_plan.peak_bytes),
        peak_gib_measured=max(peaks) if peaks else None,
        plan=[
            {"step": step.name, "item": item.name, "gib": gib(item.bytes), "where": item.where}
            for step in largest_plan.steps
            for item in step.items
        ],
        complete=True,
    )
    return record


def projected_seconds(searches: dict, samples: int) -> float | None:
    """The searches' seconds at ``samples`` windows, from the largest size measured (cost is linear in
    tokens); ``None`` before any size is measured."""
    points = [entry["sizes"][-1] for entry in searches.values() if entry["sizes"]]
    if not points:
        return None
    return sum(point["seconds"] * samples / point["samples"] for point in points)


def write_record(path: Path, record: dict) -> None:
    write_beside(path, json.dumps(record, indent=2) + "\n")


def write_beside(path: Path, text: str) -> None:
    """``text`` to ``path`` whole or not at all, its folder made first."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomically(path, text)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--smoke", action="store_true", help="A tiny shape on the CPU (seconds): the test suite's run."
    )
    parser.add_argument("--config", default=LLAMA_8B, help="A public config of the testing kit.")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument(
        "--samples", default="4,8,16", help="Calibration sizes (windows), comma-separated, smallest first."
    )
    parser.add_argument(
        "--budget-seconds",
        type=float,
        default=420.0,
        help="Skip a size whose searches, projected from the last size measured, would end past this.",
    )
    parser.add_argument("--seq-len", type=int, default=PAPER_SEQ_LEN)
    parser.add_argument("--drop", type=int, default=PAPER_DROP)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--commit", default=None, help="The git commit to record (default: git rev-parse HEAD)."
    )
    parser.add_argument("--out", type=Path, default=Path("docs/gpu-results/scale.json"))
    args = parser.parse_args(argv)
    if args.smoke:
        for key, value in SMOKE.items():
            setattr(args, key, value)
        if args.out == parser.get_default("out"):
            parser.error("--smoke writes no committed result: give --out")
    else:
        args.samples = tuple(sorted(int(part) for part in args.samples.split(",")))
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    result = run(args)
    write_record(args.out, result)
    print(
        f"wrote {args.out}: greedy at 64 x 2048 {result['greedy_seconds_at_paper_size']} s; "
        f"peak {result['peak_gib_measured']} GiB measured, {result['peak_gib_planned']} GiB planned"
    )
    return result


if __name__ == "__main__":
    main()
