#!/usr/bin/env bash
# The depth-pruning study on the embedded real LLM, SmolLM2-135M-Instruct (30 blocks): the report in
# docs/study-smollm2-135m/ (main grid) and docs/study-smollm2-135m/cross-controls/.
#
#   benchmarks/study_smollm2.sh                  # every part in order, then both reports
#   benchmarks/study_smollm2.sh perplexity &     # or the parts on two cores at once (OMP_NUM_THREADS=1 each)
#   benchmarks/study_smollm2.sh task_margin; wait
#   benchmarks/study_smollm2.sh cross report     # then the cross-controls and the reports
#
# Every part is a `depthprune study` over part of the grid; a cell or an evaluation already in the registry
# is never recomputed, so the `report` part only collects them (and any part can be re-run after a kill).
#
# Sizing (2-core CPU, about an hour for the grid): the paper's search settings (beam 5, GA 16 x 10, BO 200
# trials) ask for about 3,300 distinct subsets per (calibration, M) with three seeds and the random-prior
# control, and one subset costs about 0.15 s per calibration question or 32-token window on one core here, so
# the calibration is 4 instances (4 pydoc documents x 32 tokens; 4 cloze questions). Evaluation: the first 40
# windows of 128 tokens of pydoc's test split and the first 40 test cloze items.
set -euo pipefail
cd "$(dirname "$0")/.."
DEPTHPRUNE="${DEPTHPRUNE:-.venv/bin/depthprune}"
OUT="${OUT:-docs/study-smollm2-135m}"
DATA_DIR="${DEPTHPRUNE_HOME:-$HOME/.depthprune}/data"
CLOZE_TEXT="$DATA_DIR/pydoc-cloze-as-text.jsonl"
# --truncate: the documented study cut pydoc-cloze prompts to 32 tokens (80 % of them); that is now an error
# unless asked for, so the script asks, to reproduce its numbers (issue #26, docs/objectives.md).
COMMON=(
  --model smollm2-135m --drop 8,10 --searches all --samples 4 --seq-len 32 --truncate --timing shared
  --suite offline --engine torch --eval-limit 40 --eval-seq-len 128
)
MAIN=(--data pydoc,pydoc-cloze --seeds 0,1,2 --random-prior-control)
CROSS=(--data "pydoc,pydoc-cloze,text:$CLOZE_TEXT" --seeds 0 --cross-controls)

cloze_as_text() {
  # The margin's data as text for the perplexity objective: all 222 calibration cloze items as the margin
  # scores it, its prompt followed by the correct answer (one JSONL record = one document).
  mkdir -p "$DATA_DIR"
  "$DEPTHPRUNE" data show pydoc-cloze --model smollm2-135m --samples 222 --json 2>/dev/null \
    | .venv/bin/python -c '
import json, sys
for line in sys.stdin:
    item = json.loads(line)
    scored = item["scored"][item["label"]]
    print(json.dumps({"text": scored["prompt"] + scored["answer"]}))' > "$CLOZE_TEXT.tmp"
  mv "$CLOZE_TEXT.tmp" "$CLOZE_TEXT"
}

collect_parts() {
  # Bring the parts' finished cells into report directory $1's manifest (cells.json): the manifest keeps each
  # cell's own search cost, while the registry keeps one row per variant and so the latest run's cost of a
  # mask that several cells found (a later part re-finding a cell from the memo would cost ~0 s).
  .venv/bin/python - "$1" "$OUT"/parts/*/cells.json <<'PY'
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

part() {
  case "$1" in
    perplexity | task_margin)
      "$DEPTHPRUNE" study "${COMMON[@]}" "${MAIN[@]}" --objectives "$1" --out "$OUT/parts/$1" ;;
    cross)
      cloze_as_text
      collect_parts "$OUT/cross-controls"
      "$DEPTHPRUNE" study "${COMMON[@]}" "${CROSS[@]}" --out "$OUT/cross-controls" ;;
    report)
      collect_parts "$OUT"
      "$DEPTHPRUNE" study "${COMMON[@]}" "${MAIN[@]}" --out "$OUT"
      rm -rf "$OUT/parts" ;;
    *) echo "unknown part $1: perplexity, task_margin, cross or report" >&2; exit 2 ;;
  esac
}

for name in "${@:-perplexity task_margin cross report}"; do
  for each in $name; do part "$each"; done
done
