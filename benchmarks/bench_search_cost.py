"""Search cost: the study's panel scored naively, by today's scorer and with the exact shortcuts, in one run.

For each objective and each of the paper's seven searches (one_shot, greedy, beam, genetic, bayesian, cbo,
fast_block_select) the search runs alone on a freshly built evaluator (cold memo, standalone timing; through
``pruning.prune.run_searches``, so the single-block prior counts for the searches that use it), once per mode:

* ``naive`` — a full forward per candidate (SLEB): every kept block, the LM head on every position, no
  cache, no memo;
* ``today`` — the boundary cache of the dense pass, the memo and the LM head only where needed
  (``shortcuts=False``);
* ``shortcuts`` — plus the base boundaries, shared prefixes and rankings stopped at a lower bound.

Per search and mode it records the selection, the reported loss, block-forwards, LM-head positions,
candidates stopped early and the search's wall time (the evaluator's start-up, i.e. loading and the dense
reference pass, is reported apart). The three modes of a search run one after another in an order that
rotates from search to search, so that drift of a shared machine does not favour one mode. Writes a section
``## Search cost: exact shortcuts`` into ``docs/benchmarks.md`` unless ``--no-write``.

Run (the real model; 1 torch thread, since two threads on a shared 2-core machine stall each other)::

    .venv/bin/python benchmarks/bench_search_cost.py --model smollm2-135m
    .venv/bin/python benchmarks/bench_search_cost.py --model demo --no-write   # the demo model
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import time
from pathlib import Path

import torch
from docs_section import DOCS, write_section  # benchmarks/, on sys.path when run as a script

from pruning.calibration.objectives import CalibrationConfig
from pruning.calibration.scorer import build_evaluator
from pruning.prune import canonical_model, run_searches
from pruning.search import STUDY_SEARCHES

SECTION = "## Search cost: exact shortcuts"
MODES = ("naive", "today", "shortcuts")
DATA = {
    "real": {"perplexity": "pydoc", "task_margin": "pydoc-cloze"},
    "demo": {"perplexity": "demo:text@{model}", "task_margin": "demo:qa@{model}"},
}


def resolve(args) -> tuple[str, str]:
    """The model directory and the data family (``real`` or ``demo``)."""
    from depthprune.demo.paths import find_demo_dir

    if args.model == "demo":
        from depthprune.demo.model import ensure_demo_model

        return str(ensure_demo_model(progress=True)), "demo"
    model = canonical_model(args.model)
    return model, "demo" if find_demo_dir(model) is not None else "real"


def run_one(model: str, config: CalibrationConfig, mode: str, search: str, args) -> dict:
    """One search alone on a fresh evaluator in one mode."""
    evaluator = build_evaluator(
        model,
        config,
        naive=mode == "naive",
        shortcuts=mode == "shortcuts",
        batch_size=args.batch_size,
        progress=False,
    )
    options = {"bayesian": {"trials": args.bayesian_trials}} if search == "bayesian" else {}
    (run,) = run_searches(evaluator, args.drop, (search,), seed=args.seed, options=options, progress=False)
    return {
        "search": search,
        "mode": mode,
        "removed": list(run.result.removed_blocks),
        "loss": run.result.loss,
        "seconds": run.seconds,
        "setup_seconds": evaluator.stats.setup_seconds,
        "block_forwards": run.block_forwards,
        "head_positions": run.head_positions,
        "stopped_early": run.stopped_early,
        "subsets": run.subset_evaluations,
    }


def bench_objective(model: str, family: str, objective: str, args) -> dict:
    """Every search of the panel in every mode under one objective."""
    samples = args.text_samples if objective == "perplexity" else args.qa_samples
    data = DATA[family][objective].format(model=model)
    config = CalibrationConfig(objective, data, samples=samples, seq_len=args.seq_len, seed=0)
    rows = []
    for index, search in enumerate(args.searches):
        modes = [args.modes[(index + shift) % len(args.modes)] for shift in range(len(args.modes))]
        for mode in modes:
            row = run_one(model, config, mode, search, args)
            rows.append(row)
            print(json.dumps({"objective": objective, **row}), flush=True)
    probe = build_evaluator(model, config, batch_size=args.batch_size, progress=False)
    return {
        "objective": objective,
        "data": data,
        "samples": samples,
        "batches": len(probe.run_batches),
        "num_blocks": probe.num_blocks,
        "dense_loss": probe.dense_loss(),
        "rows": rows,
    }


def totals(result: dict, modes: tuple[str, ...]) -> dict[str, dict[str, float]]:
    """Per mode: block-forwards, head positions, stopped candidates and seconds summed over the panel."""
    summed = {}
    for mode in modes:
        rows = [row for row in result["rows"] if row["mode"] == mode]
        summed[mode] = {
            key: sum(row[key] or 0 for row in rows)
            for key in ("block_forwards", "head_positions", "stopped_early", "seconds")
        }
    return summed


def agreement(result: dict, search: str, modes: tuple[str, ...]) -> tuple[bool, float]:
    """Whether every mode selected the same blocks, and the largest loss difference from ``today``."""
    rows = {row["mode"]: row for row in result["rows"] if row["search"] == search}
    same = len({tuple(rows[mode]["removed"]) for mode in modes}) == 1
    reference = rows.get("today", rows[modes[0]])["loss"]
    return same, max(abs(rows[mode]["loss"] - reference) for mode in modes)


def ratio(numerator: float, denominator: float) -> str:
    return f"{numerator / denominator:.2f}×" if denominator else "–"


def objective_table(result: dict, args) -> list[str]:
    modes = tuple(args.modes)
    lines = [
        f"**{result['objective']}** on `{result['data']}` ({result['samples']} samples × ≤{args.seq_len} "
        f"tokens, {result['batches']} batches; N = {result['num_blocks']}, M = {args.drop}; dense loss "
        f"{result['dense_loss']:.4f})",
        "",
        "| search | removed blocks | same in all modes | block-forwards "
        + " / ".join(modes)
        + " | LM-head positions "
        + " / ".join(modes)
        + " | stopped early | wall s "
        + " / ".join(modes)
        + " |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for search in args.searches:
        rows = {row["mode"]: row for row in result["rows"] if row["search"] == search}
        same, difference = agreement(result, search, modes)
        agreed = f"{'yes' if same else 'NO'} (Δloss {difference:.1e})"
        lines.append(
            f"| {search} | {rows[modes[-1]]['removed']} | {agreed} | "
            + " / ".join(f"{rows[mode]['block_forwards']:,}" for mode in modes)
            + " | "
            + " / ".join(f"{rows[mode]['head_positions']:,}" for mode in modes)
            + f" | {rows[modes[-1]]['stopped_early']} | "
            + " / ".join(f"{rows[mode]['seconds']:.1f}" for mode in modes)
            + " |"
        )
    summed = totals(result, modes)
    lines.append(
        "| **panel** | | | "
        + " / ".join(f"**{summed[mode]['block_forwards']:,}**" for mode in modes)
        + " | "
        + " / ".join(f"{summed[mode]['head_positions']:,}" for mode in modes)
        + f" | {summed[modes[-1]]['stopped_early']} | "
        + " / ".join(f"**{summed[mode]['seconds']:.1f}**" for mode in modes)
        + " |"
    )
    if {"naive", "today", "shortcuts"} <= set(modes):
        forwards = {mode: summed[mode]["block_forwards"] for mode in modes}
        seconds = {mode: summed[mode]["seconds"] for mode in modes}
        lines += [
            "",
            "Panel: block-forwards naive / shortcuts = "
            f"**{ratio(forwards['naive'], forwards['shortcuts'])}** (today / shortcuts "
            f"{ratio(forwards['today'], forwards['shortcuts'])}); wall time today / "
            f"shortcuts = **{ratio(seconds['today'], seconds['shortcuts'])}** (naive / shortcuts "
            f"{ratio(seconds['naive'], seconds['shortcuts'])}).",
        ]
    return lines


def reading(results: list[dict], args) -> list[str]:
    """The goals of issue 19 checked against the panel totals, and why a ratio is what it is."""
    if not {"naive", "today", "shortcuts"} <= set(args.modes):
        return []
    lines = [
        "Goals (issue 19: at least 5× fewer block-forwards than naive, 2× less wall time than today):",
        "",
    ]
    for result in results:
        summed = totals(result, tuple(args.modes))
        forwards = summed["naive"]["block_forwards"] / max(summed["shortcuts"]["block_forwards"], 1)
        seconds = summed["today"]["seconds"] / max(summed["shortcuts"]["seconds"], 1e-9)
        same = all(agreement(result, search, tuple(args.modes))[0] for search in args.searches)
        lines.append(
            f"- {result['objective']}: {forwards:.2f}× fewer block-forwards than naive "
            f"({'met' if forwards >= 5 else 'not met'}), {seconds:.2f}× less wall time than today "
            f"({'met' if seconds >= 2 else 'not met'}); selections "
            f"{'identical' if same else 'NOT identical'} in all three modes."
        )
    lines += [
        "",
        "Why the ratios are what they are: a candidate base ∪ {j} of greedy or beam now runs from block j, "
        "where today's scorer restarts it from the dense boundary before its first removed block (which is "
        "early once greedy or beam removed an early block); the LM head still runs once per candidate and "
        "batch. Early stopping needs a per-sample floor: a perplexity candidate with b of B batches scored "
        "stops only when its loss exceeds B/b times the best one, so it mostly cuts the clearly bad "
        "candidates, and the task margin (no floor) never stops. Naive also pays for every repeat that the "
        "memo answers (BO and GA revisit sets) and for the LM head on every position. Searches that need "
        "values (genetic, bayesian, cbo, fast_block_select) gain only from trie nodes that earlier sets "
        "of the same run left in the cache.",
    ]
    return lines


def section(results: list[dict], args, info: dict) -> str:
    header = (
        f"`benchmarks/bench_search_cost.py` on `{args.model}` (`{info['model']}`), float32, {args.threads} "
        f"torch thread(s) on {platform.machine()}, M = {args.drop}, seed {args.seed}, bayesian "
        f"{args.bayesian_trials} trials (the study's 200 would not fit the time box), other searches at the "
        f"study's settings; batch size {args.batch_size}. Measured {info['date']}, {info['minutes']:.1f} min "
        f"in all; load average before {info['load_before']}, after {info['load_after']} (a machine shared "
        "with other jobs: wall times are noisy, block-forwards are not)."
    )
    command = (
        f"Command: `.venv/bin/python benchmarks/bench_search_cost.py --model {args.model} --drop {args.drop} "
        f"--text-samples {args.text_samples} --qa-samples {args.qa_samples} --seq-len {args.seq_len} "
        f"--batch-size {args.batch_size} --bayesian-trials {args.bayesian_trials} --threads {args.threads}`"
    )
    explain = (
        "Each search runs alone on a fresh evaluator (cold memo) in each mode: *naive* is a full forward per "
        "candidate (SLEB: every kept block, the LM head on every position, no memo); *today* is the boundary "
        "cache of the dense pass plus the memo (`--no-shortcuts`); *shortcuts* adds the boundaries of the "
        "sets greedy and beam extend, shared prefixes (a trie of removal sets, nodes kept within the cache "
        "budget) and, where only a ranking is needed, stopping a candidate once a lower bound of its loss "
        "exceeds the k-th best (perplexity and KL only: a margin has no floor). Wall seconds are the "
        "search's own, the prior's included where used; start-up (load, dense pass) is excluded. "
        "*Stopped early* counts the candidates answered with a lower bound."
    )
    parts = [SECTION, "", header, "", command, "", explain, ""]
    for result in results:
        parts += objective_table(result, args) + [""]
    parts += reading(results, args)
    return "\n".join(parts)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m", help="smollm2-135m, a model directory, or demo")
    parser.add_argument("--drop", type=int, default=None, help="M (default: a quarter of the blocks)")
    parser.add_argument("--objectives", default="perplexity,task_margin")
    parser.add_argument("--searches", default=",".join(STUDY_SEARCHES))
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--text-samples", type=int, default=4)
    parser.add_argument("--qa-samples", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--bayesian-trials", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None, help="also write every row here")
    parser.add_argument("--no-write", action="store_true", help="do not touch docs/benchmarks.md")
    args = parser.parse_args(argv)
    args.objectives = [name for name in args.objectives.split(",") if name]
    args.searches = [name for name in args.searches.split(",") if name]
    args.modes = [name for name in args.modes.split(",") if name]
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    started, load_before = time.perf_counter(), os.getloadavg()
    model, family = resolve(args)
    from pruning.models import load_config

    num_blocks = int(load_config(model).num_hidden_layers)
    args.drop = args.drop or max(1, math.floor(num_blocks / 4))
    results = [bench_objective(model, family, objective, args) for objective in args.objectives]
    info = {
        "model": Path(model).name,
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "minutes": (time.perf_counter() - started) / 60,
        "load_before": " ".join(f"{value:.1f}" for value in load_before),
        "load_after": " ".join(f"{value:.1f}" for value in os.getloadavg()),
    }
    if args.json:
        args.json.write_text(json.dumps({"info": info, "results": results}, indent=1))
    text = section(results, args, info)
    print(text)
    if not args.no_write:
        write_section(SECTION, text, DOCS)


if __name__ == "__main__":
    main()
