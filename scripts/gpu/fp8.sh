#!/usr/bin/env bash
# On a GPU machine: fp8 weights (Note [fp8 matmul]) checked and measured beside bf16, int8 and int4, in one call.
# Stages (default: all but offline and accuracy):
#   build     a fresh sm_90a build (scripts/gpu/check.sh build)
#   ops       the op harness on the fp8 ops (quantize, dequantize, matmul_q_forward, rmsnorm_matmul_q_forward)
#   tests     the quantization and inference-config tests of the GPU build (GPU cases included)
#   gemm      gemm_bench decode (the 8B shape's decode linears, every weight format) and fp8 (prefill linears, bf16
#             against fp8), fp8_scaling_bench (cuBLASLt's fp8 scaling modes), then PyTorch's torch._scaled_mm
#             (rowwise fp8) and bf16 matmul on the same shapes
#   e2e       inference_bench on Llama-3.1-8B and 3.2-1B shapes (E2E_MODELS), batch 1 and 8, prompt 32, 128 new
#             tokens, E2E_WEIGHTS (default dense int8 int4 fp8) in turn
#   offline   inference_bench --offline 2000 --prompt 256 --new 256 on the 8B shape: bf16, fp8, fp8 + fp8 KV cache
#   profile   where an offline forward's GPU time goes, bf16 against fp8 (PROFILE_CFGS, default "dense:auto fp8:auto":
#             weights:KV-cache dtype): inference_bench --offline 300 (prompt 256, new 256) under the CUPTI tracer (bench/cupti_trace.cpp), summed per kernel by scripts/gpu/kernel_sum.py
#             over the trace's last half (the tracer slows each kernel: compare shares, not times)
#   accuracy  bench/run_quant_accuracy.sh: a GPT-2-shaped model trained on fortunes, perplexity per weight format
# Before the call: bash scripts/gpu/prepare-carry.sh; run with carry [".carry"].
set -uo pipefail
default_steps=(build ops tests gemm e2e)
source "$(dirname "$0")/stages.sh"
models=$(mktemp -d)
for m in llama-3.1-8b llama-3.2-1b; do mkdir -p "$models/$m" && cp bench/models/$m.json "$models/$m/config.json"; done
if want ops; then
  run_ops quantize_weight_fp8 dequantize_weight matmul_q_forward rmsnorm_matmul_q_forward
  el ops
fi
if want tests; then
  for t in test_quant_ops test_inference_quant test_inference_config; do
    timeout 200 ./build-gpu/tests/$t > "$OUT/$t.log" 2>&1
    echo "$t rc=$?: $(grep -E '^\[  PASSED|^\[  FAILED' "$OUT/$t.log" | head -3 | tr '\n' ' ')"
    grep -E "^\[  FAILED|Failure|error" "$OUT/$t.log" | head -8
  done
  el tests
fi
if want gemm; then
  timeout 200 ./build-gpu/bench/gemm_bench decode > "$OUT/gemm_decode.log" 2>&1
  echo "gemm_bench decode rc=$?"; grep -A16 "^decode linears" "$OUT/gemm_decode.log" | grep -v " cuda "
  timeout 200 ./build-gpu/bench/gemm_bench fp8 > "$OUT/gemm_fp8.log" 2>&1
  echo "gemm_bench fp8 rc=$?"; grep -A21 "^prefill linears" "$OUT/gemm_fp8.log"
  if [ -z "${NO_SCALING:-}" ]; then
    timeout 200 ./build-gpu/bench/fp8_scaling_bench > "$OUT/fp8_scaling.log" 2>&1
    echo "fp8_scaling_bench rc=$?"; cat "$OUT/fp8_scaling.log"
  fi
  if [ -z "${NO_TORCH:-}" ]; then
    timeout 200 python3 bench/torch_fp8_gemm.py > "$OUT/torch_fp8.log" 2>&1
    echo "torch fp8 rc=$?"; cat "$OUT/torch_fp8.log" | tail -20
  fi
  el gemm
fi
if want e2e; then
  for m in ${E2E_MODELS:-llama-3.1-8b llama-3.2-1b}; do
    for w in ${E2E_WEIGHTS:-dense int8 int4 fp8}; do
      timeout 120 ./build-gpu/bench/inference_bench --model "$models/$m" --prompt 32 --new 128 --weights $w \
        --batch 1,8 > "$OUT/e2e-$m-$w.out" 2> "$OUT/e2e-$m-$w.err" || echo "inference_bench $m $w rc=$?"
      grep -E "^RESULT" "$OUT/e2e-$m-$w.out" | sed "s/^/$w\t/"
    done
  done
  el e2e
fi
if want offline; then
  for cfg in "dense auto" "fp8 auto" "fp8 fp8"; do
    set -- $cfg
    timeout 200 ./build-gpu/bench/inference_bench --model "$models/llama-3.1-8b" --offline 2000 --prompt 256 \
      --new 256 --weights $1 --kv-cache-dtype $2 > "$OUT/offline-$1-$2.out" 2> "$OUT/offline-$1-$2.err" ||
      echo "offline $1 kv $2 rc=$?"
    grep -E "^RESULT|^OFFLINE" "$OUT/offline-$1-$2.out" | sed "s/^/$1 kv=$2\t/"
  done
  el offline
fi
if want profile; then
  for cfg in ${PROFILE_CFGS:-dense:auto fp8:auto}; do
    w=${cfg%%:*} kv=${cfg##*:}
    CUDA_INJECTION64_PATH=$PWD/build-gpu/bench/libdscpp_cupti_trace.so DSCPP_CUPTI_OUT=$OUT/offline-$w-$kv.csv \
      timeout 200 ./build-gpu/bench/inference_bench --model "$models/llama-3.1-8b" --offline 300 --prompt 256 \
      --new 256 --weights $w --kv-cache-dtype $kv --warmup 0 > "$OUT/profile-$w-$kv.out" 2>&1 ||
      echo "profile $w kv $kv rc=$?"
    echo "== 8B offline 300 x 256/256, $w, KV $kv: GPU time per kernel over the trace's last half"
    python3 scripts/gpu/kernel_sum.py "$OUT/offline-$w-$kv.csv" --frac 0.5 --top 14
    rm -f "$OUT/offline-$w-$kv.csv"
  done
  el profile
fi
if want accuracy; then
  timeout 560 bash bench/run_quant_accuracy.sh --build build-gpu --out "$OUT/accuracy" > "$OUT/accuracy.log" 2>&1
  echo "accuracy rc=$?"; tail -12 "$OUT/accuracy.log"
  el accuracy
fi
