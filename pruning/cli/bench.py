"""``depthprune bench-evaluator``: the fast subset evaluator against naive full forwards (command line).

The measurement itself is :func:`pruning.calibration.scoring.bench.compare_with_naive`; this module parses
the options, picks the demo model's data when none is given and prints the result.
"""

from __future__ import annotations

import json
from typing import Annotated

from ground.core.cli_options import Override, with_options
from ground.core.objectives import get_objective
from ground.core.options import DeviceOptions, JsonOptions, SeedOptions
from pruning.cli.options import BenchOptions, MemoryBudgetOptions, ObjectiveOptions


def _demo_data_spec(model: str, data_kind: str) -> str:
    """The demo model's own calibration data of ``data_kind``; a user error when MODEL has none."""
    from ground.demo.paths import data_file

    if not data_file(model, "text_test").parent.is_dir():
        from ground.core.errors import UserError

        raise UserError(f"{model} has no demo data/ directory: pass --data (e.g. text:PATH or mc:PATH)")
    return f"{'demo:text' if data_kind == 'text' else 'demo:qa'}@{model}"


def _print_benchmark(
    result: dict, *, objective: str, data: str, budget: int, random_sets: int, repeats: int
) -> None:
    """The benchmark in words: workload, both sides' cost, the speedup and whether the scores agree."""
    print(
        f"{result['sets']} removal sets ({result['num_blocks']} single-block + {random_sets} random "
        f"M={budget}), objective {objective} on {data}, {result['sequences']} sequences"
    )
    print(
        f"fast : {result['fast_seconds']:8.2f} s  {result['fast_block_forwards']:6d} block-forwards  "
        f"{result['fast_head_positions']:8d} LM-head positions  (reference pass "
        f"{result['fast_reference_pass_seconds']:.2f} s, boundaries {result['cached_boundaries']})"
    )
    print(
        f"naive: {result['naive_seconds']:8.2f} s  {result['naive_block_forwards']:6d} block-forwards  "
        f"{result['naive_head_positions']:8d} LM-head positions"
    )
    if repeats > 1:
        print(
            f"medians of {repeats} interleaved rounds; fast {result['fast_seconds_each']} s, "
            f"naive {result['naive_seconds_each']} s"
        )
    print(
        f"speedup {result['speedup']}x, scores agree: {result['agree']} "
        f"(max |difference| {result['max_abs_difference']:.2e})"
    )


@with_options
def bench_evaluator(
    options: BenchOptions,
    objective: Annotated[
        ObjectiveOptions, Override(objective={"default": "task_margin"}, samples={"default": 32})
    ],
    seeding: SeedOptions,
    placement: DeviceOptions,
    memory: MemoryBudgetOptions,
    output: Annotated[JsonOptions, Override(as_json="Print one JSON object.")],
) -> None:
    """Benchmark the fast subset evaluator against naive full forwards on the same removal sets.

    Scores every single-block removal and RANDOM_SETS random sets of BUDGET blocks both ways, checks that
    the scores agree to 1e-5, and reports wall times, block-forward counts and the speedup. On a shared
    machine use --repeats 3 or more: a single run measures the neighbours as much as the evaluator.
    """
    from ground.planning.devices import auto_device_dtype
    from pruning.calibration.config import CalibrationConfig
    from pruning.calibration.scoring.bench import compare_with_naive

    as_json, seed = output.as_json, seeding.seed
    device, dtype = auto_device_dtype(placement.device, placement.dtype)
    kind = get_objective(objective.objective).data_kind
    if options.model is None:
        from ground.demo.model import ensure_demo_model

        model = str(ensure_demo_model(progress=not as_json))
    else:
        from pruning.model.sources import resolve_model

        model = resolve_model(
            options.model, progress=not as_json
        ).model  # an embedded name or a GGUF: converted
    data = options.data if options.data is not None else _demo_data_spec(model, kind)
    config = CalibrationConfig(
        objective.objective, data, samples=objective.samples, seq_len=options.seq_len, seed=seed
    )
    result = compare_with_naive(
        model,
        config,
        budget=options.budget,
        random_sets=options.random_sets,
        seed=seed,
        batch_size=options.batch_size,
        dtype=dtype,
        device=device,
        memory_budget_gb=memory.memory_budget_gb,
        progress=not as_json,
        repeats=options.repeats,
        pack_choices=options.pack,
    )
    if as_json:
        print(json.dumps(result))
    else:
        _print_benchmark(
            result,
            objective=objective.objective,
            data=data,
            budget=options.budget,
            random_sets=options.random_sets,
            repeats=options.repeats,
        )
