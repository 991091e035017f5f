"""The evaluator benchmark with interleaved repetitions: fast and naive alternate, medians are compared.

On a machine shared with other jobs a single run of each side measures the neighbours as much as the
evaluator; this runs ``--repeats`` rounds (fast then naive, then naive then fast, ...) from freshly built
evaluators and reports the median wall times, their ratio and every round's times, as one JSON object:

    python benchmarks/bench_evaluator_repeats.py [--model DIR] [--objective task_margin] [--repeats 5]

``--no-pack`` runs the fast side with one sequence per choice (the evaluator before prompt sharing).
Otherwise the workload and defaults are those of ``depthprune bench-evaluator``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="model directory (default: the demo model, built on first use)")
    parser.add_argument("--objective", default="task_margin", help="task_margin, perplexity or kl")
    parser.add_argument("--data", help="data spec (default: the model's demo:qa or demo:text)")
    parser.add_argument("--samples", type=int, default=32, help="calibration samples")
    parser.add_argument("--seq-len", type=int, default=128, help="tokens per window / longest question")
    parser.add_argument("--budget", type=int, default=4, help="blocks removed in each random set")
    parser.add_argument("--random-sets", type=int, default=100, help="random M-block sets")
    parser.add_argument("--batch-size", type=int, default=16, help="sequences per forward")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved rounds of each side")
    parser.add_argument("--no-pack", action="store_true", help="fast side: one sequence per choice")
    args = parser.parse_args()

    from depthprune.errors import UserError
    from pruning.evaluator import compare_with_naive
    from pruning.objectives import CalibrationConfig, get_objective

    try:
        model = args.model
        if model is None:
            from pruning.demo_model import ensure_demo_model

            model = str(ensure_demo_model(progress=False))
        kind = get_objective(args.objective).data_kind
        if args.data is None and not (Path(model) / "data").is_dir():
            raise UserError(f"{model} has no demo data/ directory: pass --data")
        data = args.data or f"{'demo:text' if kind == 'text' else 'demo:qa'}@{model}"
        config = CalibrationConfig(args.objective, data, samples=args.samples, seq_len=args.seq_len)
        result = compare_with_naive(model, config, budget=args.budget, random_sets=args.random_sets,
                                    batch_size=args.batch_size, progress=False, repeats=args.repeats,
                                    pack_choices=not args.no_pack)
    except UserError as error:
        raise SystemExit(f"error: {error}") from None
    result.pop("fast_stats")
    result.pop("naive_stats")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
