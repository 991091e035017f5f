#!/usr/bin/env bash
# How vLLM's CPU engine binds its threads, measured: one SmolLM2 dense engine per VLLM_CPU_OMP_THREADS_BIND
# value, one short load test each (16 requests x 64 prompt + 64 generated tokens, 3 rounds), nothing else
# running. Needs a home where `depthprune demo` has run (its registry holds the dense model):
#
#   HOME_DIR=/tmp/demo/run1/home heavy --quiet benchmarks/omp_binding.sh
#
# Prints output tok/s, mean TPOT and TTFT per binding, and the cores each engine bound (its log).
set -u
cd "$(dirname "$0")/.."
export DEPTHPRUNE_HOME="${HOME_DIR:?set HOME_DIR to a demo home}"
OUT="${OUT:-/tmp/omp-binding}"
for bind in ${BINDINGS:-auto 0-1 nobind}; do
  out="$OUT/$bind"
  mkdir -p "$out"
  # the variable set for serve reaches its engines; serve itself leaves a value it finds alone
  VLLM_CPU_OMP_THREADS_BIND=$bind .venv/bin/depthprune serve --variants dense --port 8799 --json \
    --max-model-len 512 --vllm-arg=--enforce-eager > "$out/serve.json" 2> "$out/serve.log" &
  pid=$!
  for _ in $(seq 1 300); do [ -s "$out/serve.json" ] && break; sleep 1; done
  .venv/bin/depthprune loadtest --target http://127.0.0.1:8799 --models dense --num-prompts 16 \
    --input-len 64 --output-len 64 --rounds 3 --max-rounds 3 --no-save-registry \
    --save-result "$out/loadtest.json" > "$out/loadtest.md" 2> "$out/loadtest.err"
  .venv/bin/python - "$bind" "$out/loadtest.json" <<'PY'
import json, sys
dense = json.load(open(sys.argv[2]))["models"]["dense"]
print(f"{sys.argv[1]:>8}: {dense['output_throughput']:.1f} output tok/s, TPOT {dense['mean_tpot_ms']:.0f} ms, "
      f"TTFT {dense['mean_ttft_ms']:.0f} ms")
PY
  kill -INT "$pid"; wait "$pid"
  grep -a "core ids\|Torch threads" "$DEPTHPRUNE_HOME/logs/vllm-dense.log" | tail -2
done
