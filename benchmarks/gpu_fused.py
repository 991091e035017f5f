"""The search with fused block forwards against without, at 8B scale on one GPU (issue 58 item 1).

Same model and data as ``benchmarks.gpu_scale`` (Llama-3.1-8B's shape with random bfloat16 weights built on
the card, random calibration tokens, perplexity, M = 7), at one calibration size (default 4 x 2,048):

1. the memory planner's peak for the run (``plan_prune``), before any weight exists;
2. one evaluation split into seconds per block and the rest (``benchmarks.gpu_profile``'s fit) without
   fusion, then with it (``SubsetEvaluator(fused_blocks=True)``: one ``torch.compile``-d block forward,
   :mod:`pruning.calibration.scoring.fusion`): per-block ms and TFLOP/s, and the profiler's operator table
   of each beside the result. The fused evaluator's dense pass compiles; that time is reported apart;
3. ``one_shot`` then ``greedy``, each alone on a fresh evaluator without and then with fusion (the compiled
   forward is reused, so no search pays for compiling): seconds, removal sets, calibration losses and
   their relative difference, the single-block scores of both (how far fusion moves a score against how
   close the nearest two are), and the peak ``torch.cuda.max_memory_allocated`` against the plan's.

A step that would end past ``--budget-seconds`` (projected from the steps measured) is skipped and named,
and the record is written after every step (``"complete": false`` until the end), so a lease cut short
keeps what it measured.

    python -m benchmarks.gpu_fused --out "$OUT/fused.json"     # one H200: about 2-3 minutes after start-up
    python -m benchmarks.gpu_fused --smoke --out /tmp/fused.json   # a tiny shape on the CPU (the test suite)

The smoke run traces with dynamo's ``eager`` backend (graphs reused and counted, no code generated): the
CPU is not where fusion is measured, and inductor's CPU compile would take minutes here.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

from benchmarks import gpu_scale
from benchmarks.gpu_profile import profile_evaluation

SEARCHES = ("one_shot", "greedy")
GREEDY_OVER_ONE_SHOT = 6.0
"""Greedy's seconds over one_shot's at M = 7 on the 8B shape (25.8 / 4.5 s, ``scale.json``): projects greedy
from one_shot for the budget."""
SMOKE = dict(config="tiny", device="cpu", dtype="float32", samples=2, seq_len=32, drop=2)
TOLERANCE = 1e-3
"""Relative difference of calibration losses fused and unfused searches may have (the issue's bound)."""


def split(stack, shape, args, sizes: dict, label: str, fused) -> dict:
    """Per-block seconds and TFLOP/s of one evaluation (``gpu_profile``'s fit), its operator table written
    beside the result as ``<out stem>.profile-<label>.txt``."""
    gpu_scale.release_memory(args.device)
    started = time.perf_counter()
    evaluator = gpu_scale.random_evaluator(stack, args.samples, args.seq_len, args, sizes, fused)
    setup = time.perf_counter() - started
    flops = gpu_scale.block_flops(shape, args.samples * args.seq_len, args.seq_len)
    result, table = profile_evaluation(evaluator, args.device, flops)
    del evaluator
    gpu_scale.release_memory(args.device)
    table_path = args.out.parent / f"{args.out.stem}.profile-{label}.txt"
    gpu_scale.write_beside(table_path, table + "\n")
    result.update(
        per_block_ms=round(result["per_block_seconds"] * 1e3, 3),
        evaluator_setup_seconds=round(setup, 2),
        operator_table=table_path.name,
    )
    print(
        f"{label:8s} one evaluation at {args.samples} x {args.seq_len}: {result['per_block_ms']:.2f} ms per "
        f"block ({result['block_tflops']:.1f} TFLOP/s), {result['fixed_seconds'] * 1e3:.1f} ms the rest"
    )
    return result


def first_run_per_block_ms(path: Path, device: str, samples: int) -> float | None:
    """Per-block ms of the first GPU run (``scale.json``'s profile) when it was on this card at this size."""
    try:
        first = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    profile = first.get("profile") or {}
    if first.get("device") != device or profile.get("samples") != samples:
        return None
    return round(profile["per_block_seconds"] * 1e3, 3)


def compare(searches: dict) -> dict:
    """Fused against unfused per search: the same removal set, the losses' relative difference."""
    verdicts = {}
    for search, arms in searches.items():
        if "unfused" not in arms or "fused" not in arms:
            continue
        plain, fused = arms["unfused"], arms["fused"]
        difference = abs(fused["loss"] - plain["loss"]) / max(abs(plain["loss"]), 1e-30)
        verdicts[search] = {
            "same_removal_set": plain["removed_blocks"] == fused["removed_blocks"],
            "loss_relative_difference": float(f"{difference:.3g}"),
            "losses_within_tolerance": difference <= TOLERANCE,
            "speedup": round(plain["seconds"] / max(fused["seconds"], 1e-9), 3),
        }
    return verdicts


def score_agreement(unfused: list[float], fused: list[float]) -> dict:
    """How far fusion moved the single-block scores, against the smallest gap between two of them: when the
    shift is below the gap the ranking one_shot reads is the same; above it a tie may break either way."""
    shifts = [abs(a - b) / max(abs(a), 1e-30) for a, b in zip(unfused, fused, strict=True)]
    ordered = sorted(unfused)
    gaps = [(b - a) / max(abs(a), 1e-30) for a, b in zip(ordered, ordered[1:], strict=False)]
    return {
        "max_relative_shift": float(f"{max(shifts):.3g}"),
        "smallest_relative_gap": float(f"{min(gaps):.3g}") if gaps else None,
        "same_ranking": sorted(range(len(unfused)), key=unfused.__getitem__)
        == sorted(range(len(fused)), key=fused.__getitem__),
    }


def run(args) -> dict:
    """The whole measurement (module docstring); the record is written after each step."""
    from pruning.calibration.scoring.fusion import fused_blocks
    from pruning.model.blocks import BlockStack

    started = time.perf_counter()
    config = gpu_scale.model_config(args.config)
    shape = gpu_scale.model_shape(config)
    plan = gpu_scale.plan(config, args.config, args.device, args.dtype, args.samples, args.seq_len)
    stack = BlockStack(gpu_scale.build_model(config, args.device, args.dtype))
    fusion = True if args.backend == "inductor" else args.backend
    name = gpu_scale.device_name(args.device)
    record = {
        "device": name,
        "bf16_peak_tflops": gpu_scale.peak_tflops(name),
        "model": args.config,
        "dtype": args.dtype,
        "samples": args.samples,
        "seq_len": args.seq_len,
        "drop": args.drop,
        "weights": "random (same shape; time and memory do not depend on the values)",
        "fusion": f"torch.compile(backend={args.backend!r}, dynamic=False), one block forward for all",
        "model_build_seconds": round(time.perf_counter() - started, 1),
        "budget_seconds": args.budget_seconds,
        "git_commit": args.commit or gpu_scale.git_commit(),
        "per_block": {},
        "searches": {search: {} for search in SEARCHES},
        "skipped": [],
        "complete": False,
    }
    sizes = gpu_scale.planned_sizes(plan, args.device)
    record["per_block"]["unfused"] = split(stack, shape, args, sizes, "unfused", False)
    save(args.out, record)
    try:
        record["per_block"]["fused"] = split(stack, shape, args, sizes, "fused", fusion)
    except Exception as error:  # a compile failure on the card must not lose the unfused half
        record["fused_error"] = failure(error)
        print(f"fused: failed, {record['fused_error']}")
        fusion = None
    compiled = fused_blocks(stack.blocks, stack.device, fusion).stats if fusion is not None else None
    if compiled is not None:
        record["compile"] = dataclasses.asdict(compiled)
        record["compile"]["compile_seconds"] = round(compiled.compile_seconds, 2)
        print(f"compile: {compiled.graphs} graph(s) for {compiled.shapes}, {compiled.compile_seconds:.1f} s")
        unfused_ms, fused_ms = (record["per_block"][arm]["per_block_ms"] for arm in ("unfused", "fused"))
        baseline = first_run_per_block_ms(args.first_run, name, args.samples)
        record["per_block"].update(
            speedup=round(unfused_ms / max(fused_ms, 1e-9), 3),
            first_run_per_block_ms=baseline,
            speedup_over_first_run=round(baseline / max(fused_ms, 1e-9), 3) if baseline else None,
        )
    save(args.out, record)
    run_searches(stack, shape, args, sizes, fusion, record, started)
    peaks = [arm["peak_gib"] for arms in record["searches"].values() for arm in arms.values()]
    measured = max((peak for peak in peaks if peak is not None), default=None)
    record.update(
        compile_seconds_after_searches=round(compiled.compile_seconds, 2) if compiled else None,
        graphs_after_searches=compiled.graphs if compiled else None,
        peak_gib_planned=gpu_scale.gib(plan.peak_bytes),
        peak_gib_measured=measured,
        peak_error=round(plan.peak_bytes / gpu_scale.GIB / measured - 1, 3) if measured else None,
        elapsed_seconds=round(time.perf_counter() - started, 1),
        complete=True,
    )
    return record


def run_searches(stack, shape, args, sizes: dict, fusion, record: dict, started: float) -> None:
    """one_shot then greedy, each without then with fusion, on fresh evaluators; budget-checked per step."""
    singles: dict[str, list[float]] = {}

    def keep_single_scores(label):
        def keep(run, evaluator):
            if run.search == "one_shot":
                singles[label] = [float(value) for value in evaluator.single_block_scores()]

        return keep

    arms = (("unfused", False), ("fused", fusion)) if fusion is not None else (("unfused", False),)
    for search in SEARCHES:
        for label, fused in arms:
            projected = projected_seconds(record["searches"], search)
            if time.perf_counter() - started + projected > args.budget_seconds:
                print(f"skipped {search} {label}: about {projected:.0f} s, past --budget-seconds")
                record["skipped"].append(f"{search} {label}")
                continue
            try:
                (point,) = gpu_scale.measure(
                    stack, shape, args, args.samples, sizes, (search,), fused, keep_single_scores(label)
                ).values()
            except Exception as error:  # one arm's failure (out of memory, say) must not lose the others
                record.setdefault("errors", {})[f"{search} {label}"] = failure(error)
                print(f"{search} {label}: failed, {failure(error)}")
                gpu_scale.release_memory(args.device)
                continue
            record["searches"][search][label] = point
            print(
                f"{search:9s} {label:8s}: {point['seconds']:7.2f} s, "
                f"{point['achieved_tflops']:6.1f} TFLOP/s, removed {point['removed_blocks']}, "
                f"loss {point['loss']:.6f}"
            )
            record["agreement"] = compare(record["searches"])
            if len(singles) == 2:
                record["single_block_scores"] = score_agreement(singles["unfused"], singles["fused"])
            save(args.out, record)


def failure(error: Exception) -> str:
    return f"{type(error).__name__}: {str(error)[:1500]}"


def projected_seconds(searches: dict, search: str) -> float:
    """A step's seconds from what was measured: the same search's other arm, else one_shot's scaled."""
    measured = [arm["seconds"] for arm in searches[search].values()]
    if measured:
        return max(measured)
    one_shot = [arm["seconds"] for arm in searches["one_shot"].values()]
    return max(one_shot) * GREEDY_OVER_ONE_SHOT if one_shot else 0.0


def save(path: Path, record: dict) -> None:
    gpu_scale.write_record(path, record)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="A tiny shape on the CPU (seconds).")
    parser.add_argument("--config", default=gpu_scale.LLAMA_8B, help="A public config of the testing kit.")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--samples", type=int, default=4, help="Calibration windows.")
    parser.add_argument("--seq-len", type=int, default=gpu_scale.PAPER_SEQ_LEN)
    parser.add_argument("--drop", type=int, default=gpu_scale.PAPER_DROP)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--backend",
        default=None,
        help="torch.compile backend of the fused arm (inductor; eager under --smoke).",
    )
    parser.add_argument(
        "--budget-seconds", type=float, default=230.0, help="Skip a step projected to end past this."
    )
    parser.add_argument(
        "--first-run",
        type=Path,
        default=Path("docs/gpu-results/scale.json"),
        help="The first GPU run, whose per-block time the fused one is set against.",
    )
    parser.add_argument("--commit", default=None, help="The git commit to record (default: HEAD).")
    parser.add_argument("--out", type=Path, default=Path("docs/gpu-results/fused.json"))
    args = parser.parse_args(argv)
    if args.smoke:
        for key, value in SMOKE.items():
            setattr(args, key, value)
        if args.out == parser.get_default("out"):
            parser.error("--smoke writes no committed result: give --out")
        if args.budget_seconds == parser.get_default("budget_seconds"):
            args.budget_seconds = float("inf")  # a loaded CPU is slow, not over a lease
        args.backend = args.backend or "eager"  # traces and reuses graphs; inductor is refused on the CPU
    args.backend = args.backend or "inductor"
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    result = run(args)
    save(args.out, result)
    per_block = result["per_block"]
    print(
        f"wrote {args.out}: per block {per_block['unfused']['per_block_ms']} -> "
        f"{per_block.get('fused', {}).get('per_block_ms')} ms ({per_block.get('speedup')}x); "
        f"agreement {result.get('agreement')}; "
        f"peak {result['peak_gib_measured']} GiB measured, {result['peak_gib_planned']} GiB planned"
    )
    return result


if __name__ == "__main__":
    main()
