"""Carry-over in a load-test result: each run's mean TTFT by whether the run before used the same engine.

The arms' order is rebuilt from :func:`loadtest.order.round_order` (the order ``loadtest`` ran them in) and
the per-round ``mean_ttft_ms`` of the saturation phase in the result JSON; the baseline and its A/A arm
(``dense``, ``dense (A/A)``) share one engine. Prints, per arm and predecessor kind, the number of
runs, their median mean TTFT and how many exceeded ``--slow-ms`` (docs/benchmarks.md, "The order's effect")::

    .venv/bin/python -m benchmarks.carryover /tmp/bench-comparison/final1/run0.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from loadtest.benchmark import AA_ARM_SUFFIX
from loadtest.order import round_order


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", type=Path, help="loadtest --save-result JSON files")
    parser.add_argument("--slow-ms", type=float, default=900.0, help="A run slower than this is a stall.")
    args = parser.parse_args()
    for path in args.results:
        result = json.loads(path.read_text())
        baseline = result["baseline"]
        # The order the arms were given to round_order; results before it was recorded list the models in
        # round 0's order, which is the given order only for blocks whose first row is 0, 1, 2 (3 arms).
        arms = result["precision"]["order"].get("arms") or list(result["models"])
        engine = {arm: arm.removesuffix(AA_ARM_SUFFIX) for arm in arms}
        sequence = [
            (arm, result["models"][arm]["rounds"][index]["mean_ttft_ms"])
            for index in range(len(result["models"][baseline]["rounds"]))
            for arm in round_order(arms, index)
        ]
        groups: dict[tuple[str, str], list[float]] = {}
        for (previous, _), (arm, ttft) in zip(sequence, sequence[1:], strict=False):
            kind = "same" if engine[previous] == engine[arm] else "other"
            groups.setdefault((arm, kind), []).append(ttft)
        print(path)
        for (arm, kind), values in sorted(groups.items()):
            slow = sum(value > args.slow_ms for value in values)
            print(
                f"  {arm:14s} after the {kind:5s} engine: {len(values):3d} runs, median mean TTFT "
                f"{statistics.median(values):6.0f} ms, {slow} over {args.slow_ms:g} ms"
            )


if __name__ == "__main__":
    main()
