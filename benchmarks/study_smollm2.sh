#!/usr/bin/env bash
# The depth-pruning study on the embedded real LLM, SmolLM2-135M-Instruct (30 blocks): the report in
# docs/study-smollm2-135m/ and its generated reading (issue 29's protocol).
#
#   benchmarks/study_smollm2.sh                  # the whole rerun, one command: objectives two at a time, then
#                                                # the report, the generated reading and the truncation check
#   WITH_KL=1 benchmarks/study_smollm2.sh        # the same plus the KL objective (CBO refuses KL: not run there)
#   benchmarks/study_smollm2.sh task_ce report reading check   # or any parts, in order
#   benchmarks/study_smollm2.sh cross            # the cross-controls (not part of the default run, see below)
#   benchmarks/study_smollm2.sh round5           # issue 55's reruns, each resumable (rerun the same command after
#                                                # a kill: cells and judged masks are kept): CBO at greedy's
#                                                # budget (cbo-matched, then adopt), the 64-question task arm's
#                                                # evaluation (arm64) and the cross-controls on the yardstick
#   WORKERS=6 DEVICE=cuda benchmarks/study_smollm2.sh workers reading check
#                                                # the same grid as registry workers (one study over the three
#                                                # objectives, float32 on every device): any number of them, on
#                                                # any machines sharing DEPTHPRUNE_HOME's registry, resume each
#                                                # other's queue; the last one writes the report
#
# The grid (issue 29): objectives perplexity (pydoc), task_margin (the exact PuDDing margin) and task_ce (from
# the objectives work; pydoc-cloze), and kl with WITH_KL=1; M = 7 and 8 — the paper's 7 and 9 of 32 blocks,
# by fraction of the 30 blocks — plus M = 10, an extension the reading labels as such; the paper's seven
# searches and the three objective-blind baselines (reported apart); seeds 0, 1, 2, each drawing its own
# calibration samples (cells record data_seed); the random-prior control. Questions are never truncated:
# measured on this machine, the 222 pydoc-cloze calibration items are 25-125 tokens with SmolLM2's tokenizer
# (median 42; 177 are over 32 tokens, which the previous run, --seq-len 32, cut), and --choice-seq-len 128
# keeps them whole while text instances stay 32 tokens. The `check` part fails if any cell records truncated_items.
#
# Every part is a `depthprune study` over part of the grid; a cell or an evaluation already in the registry
# is never recomputed, so any part can be re-run after a kill and `report` only collects.
#
# Measured (2026-11-25/26, the committed report; float32, registry workers sharing one queue): the 101
# perplexity cells at M = 7 and 8 (and 17 at M = 10) ran on one H100 as six workers in 7.5 minutes; the other
# 278 cells (the rest of perplexity at M = 10, every task_margin and task_ce cell) ran on this machine's 2
# cores as two workers, one thread each: 63 s per cell per core on average, search and evaluation (40 items
# per task) together, 4.9 h of one core. On CPU alone the whole grid is about 6.5 core-hours: about 3.3 h
# with both cores. To fit about 90 minutes, pin the draw (DATA_SEED=0: deterministic searches then
# run once and their other seeds' cells are copied, reused_from; roughly a third of the cells) and drop the
# extension (DROPS=7,8), but the seeds then measure the search only, not the data draw. WITH_KL=1 adds KL
# (about perplexity's cost twice). The cross-controls (`cross`, the paper's budgets, seed 0) add 20 perplexity
# cells on the cloze items as text; the others are the grid's seed-0 cells, found in the registry.
set -euo pipefail
cd "$(dirname "$0")/.."
DEPTHPRUNE="${DEPTHPRUNE:-.venv/bin/depthprune}"
PYTHON="${PYTHON:-.venv/bin/python}"
OUT="${OUT:-docs/study-smollm2-135m}"
# In the repository, named relative to its root, so that the cross-controls' records name no file elsewhere
CLOZE_TEXT="$OUT/cross-controls/pydoc-cloze-as-text.jsonl"
ARM="$OUT/task-objectives-64"
OBJECTIVES="perplexity task_margin task_ce${WITH_KL:+ kl}"
SEARCHES_ALL=all
SEARCHES_KL=one_shot,greedy,beam,genetic,bayesian,fast_block_select,block_influence,lorp,streamline
COMMON=(
  --model smollm2-135m --drop "${DROPS:-7,8,10}" --samples 4 --seq-len 32 --choice-seq-len 128
  --timing shared --suite offline --engine torch --eval-limit 200 --eval-windows 32 --eval-seq-len 128
  ${DATA_SEED:+--data-seed "$DATA_SEED"}
)
MAIN=(--data pydoc,pydoc-cloze --seeds 0,1,2 --random-prior-control)

# Worker mode: the grid is one queue in the registry, keyed by these arguments (not by --device, --out or the
# lease), so cells done on a GPU and on this machine belong to one study. Measured 2026-11-25 on one H100:
# six workers (OMP_NUM_THREADS=2) finished 101 of the 379 cells (every perplexity cell at M = 7 and 8, 17 at
# M = 10) in 7.5 minutes; the card was mostly idle after the first two (checkpoint writing and evaluation
# are CPU work), and the seven processes on it peaked at 39 GiB.
WORKER=(
  --model smollm2-135m --drop "${DROPS:-7,8,10}" --samples 4 --seq-len 32 --choice-seq-len 128
  --timing shared --suite offline --engine torch --eval-limit 200 --eval-windows 32 --eval-seq-len 128
  --data pydoc,pydoc-cloze --seeds 0,1,2 --random-prior-control
  --objectives perplexity,task_margin,task_ce --searches all --dtype float32
  ${DATA_SEED:+--data-seed "$DATA_SEED"}
)

registry_workers() {
  # registry_workers DIR STUDY-ARGUMENTS...: $WORKERS workers on that grid's queue, reporting into DIR
  local out="$1" count="${WORKERS:-2}" pids=() share=()
  shift
  # on a named CUDA card the workers share it: each plans for 1/count of its memory
  case "${DEVICE:-auto}" in cuda*) share=(--workers-per-gpu "$count") ;; esac
  mkdir -p "$out"
  for worker in $(seq 1 "$count"); do
    # --keep-weights none: 379 checkpoints of 423 MB would not fit this machine's disk; each variant keeps
    # its numbers and the command that writes its weights again (not part of the queue key)
    OMP_NUM_THREADS="${WORKER_THREADS:-1}" "$DEPTHPRUNE" study "$@" --worker --lease-seconds 90 \
      --device "${DEVICE:-auto}" "${share[@]}" --keep-weights "${KEEP_WEIGHTS:-none}" --out "$out" \
      > "$out/worker$worker.log" 2>&1 &
    pids+=($!)
  done
  wait "${pids[@]}"
}

# The 64-question arm (issue 55 item 2): both task objectives, the margin clipped at ±1, M = 8, the seven
# (CBO last and at greedy's budget), seeds 0-2. Its searches ran on one H200 (2026-11-27, six processes; the
# first pass ran out of GPU memory with six at once and the rest ran two at a time, so bayesian's cells under
# the margin resumed from their Optuna storage: their seconds and subset evaluations count the resumed
# trials only); `arm64` judges every cell here on the yardstick and writes the arm's report.
ARM_GRID=(
  --model smollm2-135m --drop 8 --objectives task_margin,task_ce --margin-clip 1 --data pydoc-cloze
  --samples 64 --seq-len 32 --choice-seq-len 128 --seeds 0,1,2 --timing shared
  --searches one_shot,greedy,beam,genetic,bayesian,fast_block_select,cbo -o cbo.evaluations=greedy
  --suite offline --engine torch --eval-limit 200 --eval-windows 32 --eval-seq-len 128 --dtype float32
)

searches_for() { if [ "$1" = kl ]; then echo "$SEARCHES_KL"; else echo "$SEARCHES_ALL"; fi; }

collect_parts() {
  # Bring the parts' finished cells into report directory $1's manifest (cells.json): the manifest keeps each
  # cell's own search cost, while the registry keeps one row per variant and so the latest run's cost of a
  # mask that several cells found (a later part re-finding a cell from the memo would cost ~0 s).
  "$PYTHON" - "$1" "$OUT"/parts/*/cells.json <<'PY'
import json, sys
from pathlib import Path
target = Path(sys.argv[1]) / "cells.json"
manifest = json.loads(target.read_text()) if target.is_file() else {}
cells = {cell["key"]: cell for cell in manifest.get("cells", [])}
for part in filter(lambda path: Path(path).is_file(), sys.argv[2:]):  # none: the glob stayed unexpanded
    cells.update({cell["key"]: cell for cell in json.loads(Path(part).read_text())["cells"]})
target.parent.mkdir(parents=True, exist_ok=True)
target.write_text(json.dumps({**manifest, "cells": list(cells.values())}, indent=1))
PY
}

objective_part() {
  OMP_NUM_THREADS=1 "$DEPTHPRUNE" study "${COMMON[@]}" "${MAIN[@]}" --objectives "$1" \
    --searches "$(searches_for "$1")" --out "$OUT/parts/$1"
}

objectives_two_at_a_time() {
  local running=0
  for objective in $OBJECTIVES; do
    if [ "$running" -ge 2 ]; then wait -n; running=$((running - 1)); fi
    objective_part "$objective" > "$OUT/parts/$objective.log" 2>&1 &
    running=$((running + 1))
  done
  wait
}

cloze_as_text() {
  # The margin's items as text for the perplexity objective: prompt and correct answer, one document each.
  mkdir -p "$(dirname "$CLOZE_TEXT")"
  "$DEPTHPRUNE" data show pydoc-cloze --model smollm2-135m --samples 222 --seq-len 128 --json 2>/dev/null \
    | "$PYTHON" -c '
import json, sys
for line in sys.stdin:
    item = json.loads(line)
    scored = item["scored"][item["label"]]
    print(json.dumps({"text": scored["prompt"] + scored["answer"]}))' > "$CLOZE_TEXT.tmp"
  mv "$CLOZE_TEXT.tmp" "$CLOZE_TEXT"
}

without_unmatched_cbo() {
  # $2's manifest (a copy of $1's when $2 has none) without CBO cells searched at another budget than
  # greedy's: a manifest cell is kept whatever its search's options, so those must go for CBO to run again
  [ -f "$2/cells.json" ] || { mkdir -p "$2"; cp "$1/cells.json" "$2/cells.json"; }
  "$PYTHON" - "$2/cells.json" <<'PY'
import json, sys
manifest = json.load(open(sys.argv[1]))
if ((manifest.get("config") or {}).get("options") or {}).get("cbo", {}).get("evaluations") != "greedy":
    manifest["cells"] = [cell for cell in manifest["cells"] if cell["search"] != "cbo"]
    json.dump(manifest, open(sys.argv[1], "w"), indent=1)
PY
}

judged_from() {
  # Give $2's cells the yardstick numbers of $1's cells with the same mask: a mask's numbers depend on the mask
  # and the evaluation settings only (the study copies them between its own cells the same way), so only
  # the masks $1 never judged are judged again.
  "$PYTHON" - "$1/cells.json" "$2/cells.json" <<'PY'
import json, sys
judged = {}
for cell in json.load(open(sys.argv[1]))["cells"]:
    if cell.get("evaluation") and cell.get("metrics"):
        judged[tuple(sorted(cell["removed_blocks"]))] = (cell["metrics"], cell["evaluation"])
manifest = json.load(open(sys.argv[2]))
for cell in manifest["cells"]:
    found = judged.get(tuple(sorted(cell["removed_blocks"])))
    if found and found[1] != cell.get("evaluation"):
        cell["metrics"], cell["evaluation"] = dict(found[0]), dict(found[1])
json.dump(manifest, open(sys.argv[2], "w"), indent=1)
PY
}

part() {
  case "$1" in
    round5) for each in cbo-matched adopt arm64 cross reading; do part "$each"; done ;;
    cbo-matched)
      # Issue 55 item 1: the committed study with CBO at greedy's budget of subset evaluations; every other
      # cell is kept from the manifest, each new CBO mask judged on the yardstick
      without_unmatched_cbo "$OUT" "$OUT/parts/cbo-matched"
      OMP_NUM_THREADS=1 "$DEPTHPRUNE" study "${COMMON[@]}" "${MAIN[@]}" --objectives perplexity,task_margin,task_ce \
        --searches "$SEARCHES_ALL" --dtype float32 --keep-weights none -o cbo.evaluations=greedy \
        --out "$OUT/parts/cbo-matched" ;;
    adopt)
      # the finished cbo-matched manifest becomes the study's; the report is written again (nothing reruns)
      cp "$OUT/parts/cbo-matched/cells.json" "$OUT/cells.json"
      "$DEPTHPRUNE" study "${COMMON[@]}" "${MAIN[@]}" --objectives perplexity,task_margin,task_ce \
        --searches "$SEARCHES_ALL" --dtype float32 --keep-weights none -o cbo.evaluations=greedy --out "$OUT"
      rm -rf "$OUT/parts/cbo-matched" ;;
    arm64)
      judged_from "$OUT" "$ARM"
      OMP_NUM_THREADS=1 "$DEPTHPRUNE" study "${ARM_GRID[@]}" --keep-weights none --out "$ARM"
      "$PYTHON" -m benchmarks.study_reading "$ARM" --write ;;
    objectives) mkdir -p "$OUT/parts"; objectives_two_at_a_time ;;
    workers) registry_workers "$OUT" "${WORKER[@]}" ;;
    perplexity | task_margin | task_ce | kl) mkdir -p "$OUT/parts"; objective_part "$1" ;;
    report)
      # one study over every objective that ran; kl's grid has no CBO, so its report is its part's own
      collect_parts "$OUT"
      "$DEPTHPRUNE" study "${COMMON[@]}" "${MAIN[@]}" --objectives perplexity,task_margin,task_ce \
        --searches "$SEARCHES_ALL" --out "$OUT"
      if [ -n "${WITH_KL:-}" ]; then
        "$DEPTHPRUNE" study "${COMMON[@]}" "${MAIN[@]}" --objectives perplexity,kl --searches "$SEARCHES_KL" \
          --out "$OUT/kl"
      fi ;;
    reading)
      # the main reading includes the cross-controls' table when they were run (the `cross` part)
      cross=(); if [ -f "$OUT/cross-controls/study.json" ]; then cross=(--cross "$OUT/cross-controls"); fi
      arms=(--size "$OUT/calibration-size"); if [ -f "$ARM/study.json" ]; then arms+=(--arm "$ARM"); fi
      "$PYTHON" -m benchmarks.study_reading "$OUT" "${cross[@]}" "${arms[@]}" --write
      # docs/study.md's figures from the same JSON (README's study line is typed: tests/test_committed_study.py
      # says when it no longer matches)
      "$PYTHON" -m benchmarks.study_reading "$OUT" "${arms[@]}" --prose docs/study.md
      if [ -d "$OUT/kl" ]; then "$PYTHON" -m benchmarks.study_reading "$OUT/kl" --write; fi ;;
    check)
      # issue 29's acceptance: task_ce and task_margin cells, none with truncated items
      "$PYTHON" - "$OUT/study.json" <<'PY'
import json, sys
cells = json.loads(open(sys.argv[1]).read())["cells"]
objectives = {cell["objective"] for cell in cells}
truncated = [cell["key"] for cell in cells if cell.get("truncated_items")]
missing = {"task_ce", "task_margin"} - objectives
print(f"{len(cells)} cells, objectives {sorted(objectives)}, {len(truncated)} with truncated items")
if missing or truncated or any("truncated_items" not in cell for cell in cells):
    sys.exit(f"check failed: missing {sorted(missing)}; truncated {truncated[:5]}")
PY
      rm -rf "$OUT/parts" ;;
    cross)
      # Cross-controls (seed 0): perplexity on the margin's items written as text. Those documents are shorter
      # than the 32-token instances only rarely (25-125 tokens), and each instance keeps its first 32 tokens
      # while a question keeps all of its tokens: the generated reading says so.
      # With WORKERS set, as registry workers (the cells the main grid ran under seed 0 are found there).
      [ -f "$CLOZE_TEXT" ] || cloze_as_text
      # The paper's budgets only (CROSS_DROPS): the later --drop wins over COMMON's. CBO at greedy's budget as
      # in the main study; masks the main study judged keep its numbers (judged_from).
      cross=("${COMMON[@]}" --drop "${CROSS_DROPS:-7,8}" --data "pydoc,pydoc-cloze,text:$CLOZE_TEXT" --seeds 0
             --cross-controls --objectives perplexity,task_margin,task_ce --searches "$SEARCHES_ALL" --dtype float32
             -o cbo.evaluations=greedy --keep-weights none)
      if [ -f "$OUT/cross-controls/cells.json" ]; then
        without_unmatched_cbo "$OUT/cross-controls" "$OUT/cross-controls"
        judged_from "$OUT" "$OUT/cross-controls"
      fi
      if [ -n "${WORKERS:-}" ]; then registry_workers "$OUT/cross-controls" "${cross[@]}"
      else OMP_NUM_THREADS=1 "$DEPTHPRUNE" study "${cross[@]}" --out "$OUT/cross-controls"; fi
      "$PYTHON" -m benchmarks.study_reading "$OUT/cross-controls" --cross "$OUT/cross-controls" --write ;;
    *) echo "unknown part $1: objectives, workers, perplexity, task_margin, task_ce, kl, report, reading, check," \
         "cross, round5, cbo-matched, adopt or arm64" >&2
       exit 2 ;;
  esac
}

for name in "${@:-objectives report reading check}"; do
  for each in $name; do part "$each"; done
done
