"""GPU run sheet: the study's search-cost workload on one GPU, in a table beside the study's Table 4 (A40).

Llama-3.1-8B, M = 7 blocks removed, perplexity objective on C4, 64 windows x 2,048 tokens, searches
one_shot, greedy and beam, each on a cold evaluator (``--timing standalone``, the accounting of Table 4). The
memory plan is printed first (``--dry-run``); a run that cannot fit stops there with its advice. Then
``depthprune prune`` runs and the searches' wall times are set beside the A40's (551 / 3,223 / 13,869 s).

    python -m benchmarks.gpu_run_sheet [--model meta-llama/Llama-3.1-8B] [--device cuda:0]
        [--plan-only] [--out docs/gpu-run-sheet.md]

Needs a CUDA machine with the GPU extra (``pip install 'depthprune[gpu]'``), the model (gated on the hub:
``huggingface-cli login``) and C4's validation shard (downloaded on first use).
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

A40_SECONDS = {"one_shot": 551, "greedy": 3223, "beam": 13869}
"""The study's Table 4: search seconds on an NVIDIA A40 (48 GB) for this workload."""
SEARCHES = tuple(A40_SECONDS)


def gpu_name(device: str) -> str:
    """The card's name from nvidia-smi (``unknown`` without one)."""
    index = device.split(":")[1] if ":" in device else "0"
    try:
        output = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader", "-i", index],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        return output.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def prune_command(args: argparse.Namespace, *extra: str) -> list[str]:
    """The ``depthprune prune`` command line of the run sheet."""
    return [
        sys.executable, "-m", "depthprune", "prune", "--model", args.model, "--objective", "perplexity",
        "--data", "c4", "--drop", "7", "--samples", "64", "--seq-len", "2048",
        "--search", ",".join(SEARCHES), "--timing", "standalone",
        "--device", args.device, "--dtype", args.dtype, *extra,
    ]  # fmt: skip


def table(seconds: dict[str, float], card: str) -> str:
    """Markdown: each search's seconds here and on the A40, and the ratio."""
    lines = [
        f"| search | {card} (s) | A40, Table 4 (s) | A40 / here |",
        "|---|---:|---:|---:|",
    ]
    for search in SEARCHES:
        here = seconds.get(search)
        measured = f"{here:,.0f}" if here else "-"
        ratio = f"{A40_SECONDS[search] / here:.2f}x" if here else "-"
        lines.append(f"| {search} | {measured} | {A40_SECONDS[search]:,} | {ratio} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="meta-llama/Llama-3.1-8B")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--plan-only", action="store_true", help="Print the memory plan and stop.")
    parser.add_argument("--out", type=Path, default=Path("docs/gpu-run-sheet.md"))
    args = parser.parse_args()
    plan = subprocess.run(prune_command(args, "--dry-run"))
    if plan.returncode != 0 or args.plan_only:
        return plan.returncode
    card = gpu_name(args.device)
    started = time.time()
    run = subprocess.run(prune_command(args, "--json"), capture_output=True, text=True)
    if run.returncode != 0:
        print(run.stderr[-4000:], file=sys.stderr)
        return run.returncode
    outcomes = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    seconds = {outcome["search"]: outcome["search_seconds"] for outcome in outcomes}
    text = (
        f"## GPU run sheet: {args.model}, M = 7, perplexity on C4, 64 x 2048, standalone timing\n\n"
        f"Measured {time.strftime('%Y-%m-%d', time.gmtime(started))} on {card} ({platform.node()}), "
        f"{args.dtype}; whole run {time.time() - started:,.0f} s.\n\n{table(seconds, card)}\n"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
