"""``benchmarks.bench_capacity`` gives the load test every arm's block counts: its report states the ideal."""

import argparse
from pathlib import Path

from benchmarks.bench_capacity import loadtest_command
from benchmarks.bench_loadtest import BenchModels, ServedVariant
from loadtest.compare import parse_blocks_overrides


def test_the_capacity_command_names_n_and_m_of_every_served_model(tmp_path: Path):
    models = BenchModels(
        tmp_path, 30, [ServedVariant("ppl-best", tmp_path, [3, 4, 5]), ServedVariant("v25", tmp_path, [1])]
    )
    args = argparse.Namespace(
        slo="ttft_p90_ms=100,tpot_p90_ms=20",
        time_budget=60.0,
        slo_replicates=2,
        num_prompts=8,
        input_len=64,
        output_len=64,
    )
    command = loadtest_command(args, "http://gateway", models, "prompts.jsonl", tmp_path)
    assert command[command.index("--models") + 1] == "dense,ppl-best,v25"
    counts = parse_blocks_overrides([command[command.index("--blocks") + 1]])
    assert {name: (c.num_blocks, c.removed) for name, c in counts.items()} == {
        "dense": (30, 0),
        "ppl-best": (30, 3),
        "v25": (30, 1),
    }
