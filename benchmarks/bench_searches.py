"""Benchmark every search on the demo model: calibration loss, wall time, subset evaluations, block-forwards.

For each objective (perplexity on ``demo:text``, task margin on ``demo:qa``) one evaluator is built and
shared by all searches, run in one process in the order of ``--searches`` (exhaustive last, so that it
gives the exact optimum without making the others' subsets free). Writes a Markdown section
``## Searches`` into ``docs/benchmarks.md`` (replacing an older one) unless ``--no-write``.

Run (builds the demo model first if it is not cached; a few minutes on 2 cores)::

    .venv/bin/python -m benchmarks.bench_searches
    .venv/bin/python -m benchmarks.bench_searches --recipe tiny --drop 2 --no-write   # smoke test
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import time
from pathlib import Path

import torch

from benchmarks.docs_section import DOCS, write_section
from ground.demo.model import ensure_demo_model
from ground.demo.recipe import RECIPES
from pruning.calibration.config import CalibrationConfig
from pruning.calibration.scoring.build import build_evaluator
from pruning.pipeline.prune import parse_searches, run_searches

SECTION = "## Searches"


def bench_objective(model: Path, objective: str, data: str, args) -> tuple[str, list[dict], dict]:
    """Run every search on one shared evaluator; rows for the table and the configuration used."""
    samples = args.text_samples if objective == "perplexity" else args.qa_samples
    config = CalibrationConfig(objective, f"{data}@{model}", samples=samples, seq_len=args.seq_len, seed=0)
    started = time.perf_counter()
    evaluator = build_evaluator(str(model), config, progress=True)
    setup_seconds = time.perf_counter() - started
    dense = evaluator.dense_loss()
    searches = parse_searches(args.searches)
    options = {"bayesian": {"trials": args.bayesian_trials}}
    runs = run_searches(evaluator, args.drop, searches, seed=args.seed, options=options, progress=True)
    optimum = next((run.result.loss for run in runs if run.search == "exhaustive"), None)
    rows = []
    for run in runs:
        rows.append(
            {
                "search": run.search,
                "removed": list(run.result.removed_blocks),
                "loss": run.result.loss,
                "gap": None if optimum is None else run.result.loss - optimum,
                "seconds": run.seconds,
                "subsets": run.subset_evaluations,
                "forwards": run.block_forwards,
                "prior": run.used_prior,
                "exact": run.result.options.get("exact"),
            }
        )
    info = {
        "objective": objective,
        "data": data,
        "samples": samples,
        "seq_len": args.seq_len,
        "num_blocks": evaluator.num_blocks,
        "dense": dense,
        "setup_seconds": setup_seconds,
        "batches": len(evaluator.batches),
        "total_forwards": evaluator.stats.block_forwards,
    }
    return objective, rows, info


def table(rows: list[dict], info: dict) -> str:
    lines = [
        f"**{info['objective']}** on `{info['data']}` ({info['samples']} samples × "
        f"≤{info['seq_len']} tokens, {info['batches']} batches; N = {info['num_blocks']}; dense loss "
        f"{info['dense']:.4f}; evaluator start-up {info['setup_seconds']:.1f} s; "
        f"{info['total_forwards']:,} block-forwards in all)",
        "",
        "| search | removed blocks | calibration loss | gap to exhaustive | wall s | subset evaluations "
        "| block-forwards |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        gap = "" if row["gap"] is None else f"{row['gap']:+.4f}"
        forwards = "" if row["forwards"] is None else f"{row['forwards']:,}"
        note = " ¹" if row["prior"] else ""
        lines.append(
            f"| {row['search']}{note} | {row['removed']} | {row['loss']:.4f} | {gap} | "
            f"{row['seconds']:.1f} | {row['subsets']:,} | {forwards} |"
        )
    return "\n".join(lines)


def section(results, args, model: Path, wall: float, load_before: float) -> str:
    cpu = platform.processor() or platform.machine()
    header = [
        SECTION,
        "",
        f"`python -m benchmarks.bench_searches` (M = {args.drop}, seed {args.seed}, "
        f"bayesian {args.bayesian_trials} trials, other searches at the study's settings) on the demo model "
        f"`{model.name}`, float32, "
        f"{torch.get_num_threads()} torch threads on {cpu}; one shared evaluator per objective, searches run "
        f"in the order listed, {wall / 60:.1f} min in all; load average {load_before:.1f} before, "
        f"{os.getloadavg()[0]:.1f} after (the benchmark alone keeps it near 2 on 2 cores).",
        "",
        "*Subset evaluations* are the distinct removal sets a search asked for (the N single-block sets "
        "included when it used the prior), independent of sharing. *Block-forwards* and *wall s* are the "
        "work the evaluator actually did while the search ran, plus the shared single-block prior's cost for "
        "the searches marked ¹ that use it; a subset an earlier search already scored is free (the memo), so "
        "greedy and beam, whose first step is the prior, look cheaper here than they would alone. "
        "*Gap to exhaustive* is the loss above the exact optimum (C(N, M) subsets).",
        "",
    ]
    body = []
    for _objective, rows, info in results:
        body += [table(rows, info), ""]
    return "\n".join(header + body)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", choices=sorted(RECIPES), default="default", help="demo model recipe")
    parser.add_argument("--drop", type=int, default=4, help="M, blocks to remove")
    parser.add_argument("--seed", type=int, default=0, help="seed of every search")
    parser.add_argument("--searches", default="all,exhaustive", help="comma-separated, or all")
    parser.add_argument("--bayesian-trials", type=int, default=200, help="trials of the bayesian search")
    parser.add_argument("--text-samples", type=int, default=32, help="perplexity windows")
    parser.add_argument("--qa-samples", type=int, default=64, help="task-margin questions")
    parser.add_argument("--seq-len", type=int, default=128, help="tokens per window (the demo trains on 128)")
    parser.add_argument("--no-write", action="store_true", help="print the section, do not edit the docs")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    model = ensure_demo_model(RECIPES[args.recipe]())
    results = [
        bench_objective(model, "perplexity", "demo:text", args),
        bench_objective(model, "task_margin", "demo:qa", args),
    ]
    text = section(results, args, model, time.perf_counter() - started, load_before)
    print(text)
    if not args.no_write:
        write_section(SECTION, text)
        print(f"wrote {DOCS}")
    if math.isnan(sum(row["loss"] for _objective, rows, _info in results for row in rows)):
        raise SystemExit("a search returned NaN")


if __name__ == "__main__":
    main()
