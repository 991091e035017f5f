#!/usr/bin/env bash
# `make demo` three times, one after another, and the three final tables side by side (for docs/benchmarks.md,
# "Three demo runs"): do repeated runs of the whole product agree within their intervals?
#
#   benchmarks/demo_repeats.sh                 # about 3 x 10 minutes; run it on a quiet machine
#   OUT=/tmp/demo-repeats RUNS=3 benchmarks/demo_repeats.sh
#
# Each run is exactly `depthprune demo` (what `make demo` runs) from an empty home of its own
# (DEPTHPRUNE_HOME=OUT/runN/home: the GGUF conversion, the offline data, the registry and the searches'
# score memo all start empty), so no run reads anything another wrote and each wall time is a first run's.
# The machine's speed is recorded beside each run, just before and just after it (python -m
# benchmarks.machine_speed: 2-thread float32 matmul GFLOP/s and the load average), so a wall time is read
# against the machine that made it (issue 57: 773 s on a day the matmul ran 219 GFLOP/s).
# Writes OUT/runN/{demo.log,table.json,loadtest.json,machine.jsonl,...} and OUT/side_by_side.md, and prints
# the Markdown.
set -euo pipefail
cd "$(dirname "$0")/.."
DEPTHPRUNE="${DEPTHPRUNE:-.venv/bin/depthprune}"
PYTHON="${PYTHON:-.venv/bin/python}"
OUT="${OUT:-demo-repeats}"
RUNS="${RUNS:-3}"
mkdir -p "$OUT"

for run in $(seq 1 "$RUNS"); do
  dir="$OUT/run$run"
  mkdir -p "$dir"
  "$PYTHON" -m benchmarks.machine_speed > "$dir/machine.jsonl"
  started=$(date +%s)
  rm -rf "$dir/home"
  DEPTHPRUNE_HOME="$(realpath "$dir")/home" "$DEPTHPRUNE" demo --out "$dir" --json \
    > "$dir/table.json" 2> "$dir/demo.log"
  echo "$(( $(date +%s) - started ))" > "$dir/wall_seconds"
  "$PYTHON" -m benchmarks.machine_speed >> "$dir/machine.jsonl"
  echo "run $run: $(cat "$dir/wall_seconds") s; machine before, after: $(tr '\n' ' ' < "$dir/machine.jsonl")" >&2
done

"$PYTHON" - "$OUT" "$RUNS" <<'EOF' | tee "$OUT/side_by_side.md"
"""One row per variant role, one column per run: speed-up and fraction of ideal with their 95 % intervals."""
import json
import sys
from pathlib import Path

from loadtest.intervals import speedup_text

out, runs = Path(sys.argv[1]), int(sys.argv[2])
tables = [json.loads((out / f"run{i}" / "table.json").read_text().strip().splitlines()[-1]) for i in range(1, runs + 1)]
walls = [(out / f"run{i}" / "wall_seconds").read_text().strip() for i in range(1, runs + 1)]
roles = [row["variant"] for row in tables[0] if row["variant"] != "dense" and not row["variant"].startswith("#")]


def cell(row, key, suffix=""):
    if row is None or row.get(key) is None:
        return "–"
    verdict = row.get("speedup_verdict") if key != "mean_tpot_ratio" else None
    return speedup_text(row[key], row.get(f"{key}_ci95"), verdict, suffix)


print("| variant | figure | " + " | ".join(f"run {i}" for i in range(1, runs + 1)) + " |")
print("|---|---|" + "---|" * runs)
for role in roles:
    rows = [next((row for row in table if row["variant"] == role), None) for table in tables]
    removed = " / ".join(",".join(map(str, row["removed_blocks"])) or "-" for row in rows if row)
    for key, label, suffix in (
        ("output_throughput_ratio", "out tok/s ×", "x"),
        ("mean_tpot_ratio", "TPOT ×", ""),
        ("fraction_of_ideal_speedup", "of ideal", ""),
    ):
        print(f"| {role} ({removed}) | {label} | " + " | ".join(cell(row, key, suffix) for row in rows) + " |")
print("| (wall time) | s | " + " | ".join(walls) + " |")
speeds = [
    [json.loads(line) for line in (out / f"run{i}" / "machine.jsonl").read_text().splitlines()]
    for i in range(1, runs + 1)
]
print("| (machine) | matmul GFLOP/s, before → after | " + " | ".join(
    " → ".join(f"{s['matmul_gflops']:.0f}" for s in pair) for pair in speeds) + " |")
print("| (machine) | load average, before → after | " + " | ".join(
    " → ".join(f"{s['load_1m']:.1f}" for s in pair) for pair in speeds) + " |")
EOF
