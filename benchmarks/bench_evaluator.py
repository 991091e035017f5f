"""Benchmark: the fast subset evaluator against naive full forwards (the SLEB way) on one workload.

Scores every single-block removal, then 100 random sets of M=4 blocks, with both evaluators on the demo
model (built on first use), checks that the scores agree to 1e-5 and reports wall times, block-forward
counts and the wall-time speedup. Same as ``depthprune bench-evaluator``; every option passes through:

    python -m benchmarks.bench_evaluator [--model DIR] [--objective task_margin|perplexity|kl]
        [--repeats 3] [--json]

Results are recorded in docs/benchmarks.md ("Subset evaluator").
"""

from __future__ import annotations

import sys

from depthprune.cli import main

if __name__ == "__main__":
    main(["bench-evaluator", *sys.argv[1:]])
