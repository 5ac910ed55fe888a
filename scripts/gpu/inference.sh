#!/usr/bin/env bash
# On a GPU machine: what the inference issue checks, in one call (< 600 s). A fresh sm_90a build (scripts/gpu/check.sh
# build), the op harness (the paged KV-cache kernels against their CPU references among all ops), the inference and
# engine GPU tests, then bench/run_inference_bench.sh (ours against Hugging Face generate, static cache, eager and
# torch.compile) on the Llama-3.2-1B shape at batch 1 and 32 (BENCH_ARGS adds or replaces flags).
# Before the call: bash scripts/gpu/prepare-carry.sh; run with carry [".carry"].
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
t0=$(date +%s)
el() { echo "[+$(( $(date +%s) - t0 ))s] $*"; }
OUT=$OUT bash scripts/gpu/check.sh build ops | grep -E "build:|test_ops|FAIL" | head -20
el "built and test_ops"
[ -d .carry/root/usr/lib ] && export LD_LIBRARY_PATH=$PWD/.carry/root/usr/lib:${LD_LIBRARY_PATH:-}
cudnn_lib=$(grep -E "^CUDNN_LIBRARY:" build-gpu/CMakeCache.txt 2>/dev/null | cut -d= -f2)
[ -f "$cudnn_lib" ] && export LD_LIBRARY_PATH=$(dirname "$cudnn_lib"):$LD_LIBRARY_PATH
grep -E "paged|kv_cache" "$OUT/test_ops.log" | tail -8
(cd build-gpu && timeout 200 ctest --output-on-failure -j 4 -R "Inference|Engine|Paged|ProfilerComm|JobSafety") \
  > "$OUT/ctest_inference.log" 2>&1
echo "inference ctest rc=$?: $(grep -E 'tests passed' "$OUT/ctest_inference.log")"
grep -E "Failed|\*\*\*" "$OUT/ctest_inference.log" | head -10
el tests
timeout 330 bash bench/run_inference_bench.sh --build build-gpu --models llama-3.2-1b --batch 1,32 ${BENCH_ARGS:-} \
  > "$OUT/inference_bench.txt" 2>&1
echo "inference bench rc=$?"; tail -12 "$OUT/inference_bench.txt"
el done
