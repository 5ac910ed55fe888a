#!/usr/bin/env bash
# On a GPU machine: what the inference issue checks, in one call (< 600 s). Stages (default: all):
#   build   a fresh sm_90a build (scripts/gpu/check.sh build)
#   ops     the op harness (the paged KV-cache and sampling kernels against their CPU references, among all ops)
#   tests   the inference, engine and serving tests (the Hugging Face comparison runs where torch is installed)
#   bench   bench/run_inference_bench.sh: ours against Hugging Face generate (static cache, eager and
#           torch.compile) on the Llama-3.2-1B shape at batch 1, 32 and 64 (BENCH_ARGS adds or replaces flags)
#   bench8  ours on the Llama-3.1-8B shape at batch 1 and 32 (BENCH8_ARGS adds flags; no PyTorch peer: HF generate on 8B would not fit the call)
#   offline ours, offline throughput on the Llama-3.1-8B shape: 2,000 requests of 256 + 256 tokens
# Before the call: bash scripts/gpu/prepare-carry.sh; run with carry [".carry"].
set -uo pipefail
default_steps=(build ops tests bench bench8 offline)
source "$(dirname "$0")/stages.sh"
if want ops; then
  timeout 400 ./build-gpu/tests/test_ops >"$OUT/test_ops.log" 2>&1
  echo "test_ops rc=$?"; grep -E "paged|kv_cache|sample|penalt|logprob|cases passed|FAIL" "$OUT/test_ops.log" | tail -12
  el ops
fi
if want tests; then
  (cd build-gpu && timeout 240 ctest --output-on-failure -j 4 -R "Inference|Engine|Paged|Sampler|CudaGraph|ProfilerComm|JobSafety|Serve|Chat|Quant|Perplexity|python_test_(hf_inference|serve|chat)") \
    > "$OUT/ctest_inference.log" 2>&1
  echo "inference ctest rc=$?: $(grep -E 'tests passed' "$OUT/ctest_inference.log")"
  grep -E "Failed|\*\*\*" "$OUT/ctest_inference.log" | head -10
  el tests
fi
if want bench; then
  timeout 330 bash bench/run_inference_bench.sh --build build-gpu --models llama-3.2-1b --batch 1,32,64 ${BENCH_ARGS:-} \
    > "$OUT/inference_bench.txt" 2>&1
  echo "inference bench rc=$?"; grep -vE "^== |^KV cache|^CUDA graphs" "$OUT/inference_bench.txt" | tail -14
  el bench
fi
if want bench8; then
  timeout 300 bash bench/run_inference_bench.sh --build build-gpu --models llama-3.1-8b --batch 1,32 --no-torch \
    ${BENCH8_ARGS:-} > "$OUT/inference_bench8.txt" 2>&1
  echo "8B bench rc=$?"; grep -vE "^== |^KV cache" "$OUT/inference_bench8.txt" | tail -8
  el bench8
fi
if want offline; then
  timeout 300 bash bench/run_inference_bench.sh --build build-gpu --models llama-3.1-8b --prompt 256 --new 256 \
    --offline "${OFFLINE_REQUESTS:-2000}" > "$OUT/inference_offline.txt" 2>&1
  echo "offline rc=$?"; grep -vE "^== |^impl" "$OUT/inference_offline.txt" | tail -6
  el offline
fi
