#!/usr/bin/env bash
# On a GPU machine (H100/H200): build for sm_90a, then run the op harness, the GPU unit tests and the kernel
# self-checks/benchmarks. Logs go to $OUT (or ./gpu-out). Extra libraries the image lacks (ICU) may be unpacked under
# .carry/root (scripts/gpu/prepare-carry.sh puts them there). Usage: scripts/gpu/check.sh [build|ops|unit|kernels|train|all|losscurve|attn|ckpt|dp]...
# losscurve (GPT-2 124M loss curves, CPU vs GPU f32/bf16/fp16, ~2 min), attn (our attention vs PyTorch flash SDPA),
# ckpt (checkpoint save/load speed, llama-1b) and dp (NCCL tests + data-parallel A/B; 2+ GPUs, DP_GPUS=N) run only
# when named; "all" leaves them out.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
carry=$PWD/.carry/root/usr
if [ -d "$carry" ]; then
  export LD_LIBRARY_PATH=$carry/lib:${LD_LIBRARY_PATH:-}
  icu=(-DICU_ROOT="$carry" -DCMAKE_PREFIX_PATH="$carry")  # ICU; cpp-httplib and OpenSSL's headers (serve)
else
  icu=()
fi
export NCCL_NVLS_ENABLE=0
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(all)
want() { for s in "${steps[@]}"; do [ "$s" = all ] || [ "$s" = "$1" ] && return 0; done; return 1; }
named() { for s in "${steps[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }
summary=()

if want build; then
  t0=$(date +%s)
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DDSCPP_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
    "${icu[@]}" >"$OUT/cmake.log" 2>&1 || { tail -40 "$OUT/cmake.log"; exit 1; }
  # -k 0: one broken target (a test in progress) must not keep the others from being built and run.
  if ! ninja -C build-gpu -k 0 -j "$(nproc)" >"$OUT/build.log" 2>&1; then
    grep -E "error|Error|FAILED" "$OUT/build.log" | head -40
    summary+=("build: FAILED targets (see build.log) after $(( $(date +%s) - t0 )) s")
  else
    summary+=("build: ok in $(( $(date +%s) - t0 )) s")
  fi
  grep -E "cuDNN attention" "$OUT/cmake.log"
fi
# cuDNN may live outside the loader's path (a Python wheel's lib folder): put the one CMake linked on it.
cudnn_lib=$(grep -E "^CUDNN_LIBRARY:" build-gpu/CMakeCache.txt 2>/dev/null | cut -d= -f2)
[ -f "$cudnn_lib" ] && export LD_LIBRARY_PATH=$(dirname "$cudnn_lib"):${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"

if want ops; then
  timeout 400 ./build-gpu/tests/test_ops >"$OUT/test_ops.log" 2>&1
  rc=$?
  grep -E "FAIL" "$OUT/test_ops.log" | head -40
  summary+=("test_ops rc=$rc: $(grep -E 'passed.*failed' "$OUT/test_ops.log" | tail -1)")
fi
if want unit; then
  (cd build-gpu && timeout 500 ctest --output-on-failure -j 4 -R "Cuda|Gpu|GPU|Mixed|Nccl|NCCL|Profiler" ) >"$OUT/ctest_gpu.log" 2>&1
  rc=$?
  grep -E "Failed|FAILED|\*\*\*" "$OUT/ctest_gpu.log" | head -30
  summary+=("gpu ctest rc=$rc: $(grep -E 'tests passed' "$OUT/ctest_gpu.log" | tail -1)")
fi
if want kernels; then
  timeout 200 ./build-gpu/bench/gemm_bench >"$OUT/gemm_bench.log" 2>&1; r1=$?
  timeout 200 ./build-gpu/bench/attention_bench >"$OUT/attention_bench.log" 2>&1; r2=$?
  tail -25 "$OUT/gemm_bench.log"; tail -25 "$OUT/attention_bench.log"
  summary+=("gemm_bench rc=$r1, attention_bench rc=$r2")
fi
if want train; then
  timeout 560 bash bench/run_train_bench.sh --build build-gpu --steps 12 --warmup 3 --gemm-tflops 678 \
    ${TRAIN_ARGS:-} >"$OUT/train_bench.log" 2>&1
  summary+=("train bench rc=$?")
  tail -20 "$OUT/train_bench.log"
fi
if named losscurve; then
  # tests/unit/test_loss_curve_gpu.cpp: prints the four loss curves as a markdown table, then checks them.
  timeout 560 ./build-gpu/tests/test_loss_curve_gpu >"$OUT/losscurve.log" 2>&1
  rc=$?
  grep -E "^\[loss curve\]" "$OUT/losscurve.log"
  sed -n '/^GPT-2 124M, micro-batch/,/^wall time/p' "$OUT/losscurve.log"
  grep -E -A3 "Failure$" "$OUT/losscurve.log" | head -40
  summary+=("losscurve rc=$rc: $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/losscurve.log" | tr '\n' ' ')")
fi
if named attn; then
  timeout 300 bash bench/run_attention_bench.sh --build build-gpu >"$OUT/attention_vs_torch.log" 2>&1
  summary+=("attention vs torch rc=$?")
  cat "$OUT/attention_vs_torch.log"
fi
if named ckpt; then
  # Checkpoint save/load of llama-1b on the GPU and on the CPU (bench/run_ckpt_bench.sh), ~35 GB of disk at a time.
  timeout 560 bash bench/run_ckpt_bench.sh --build build-gpu --no-hf >"$OUT/ckpt_bench.log" 2>&1
  summary+=("ckpt bench rc=$?")
  grep -v "^\[" "$OUT/ckpt_bench.log" | tail -25
fi
if named dp; then
  # Multi-GPU: the NCCL tests, then the data-parallel A/B of bench/run_dp_sweep.sh on GPT-2 124M (DDP-like 25 MB and
  # 100 MB buckets, each with NCCL's kernels and with copy engines). ~2.5 min on 2 H200s after the build.
  (cd build-gpu && timeout 300 ctest -j 2 -R "Nccl|NCCL") >"$OUT/ctest_nccl.log" 2>&1
  summary+=("nccl ctest rc=$?: $(grep -E 'tests passed' "$OUT/ctest_nccl.log" | tail -1)")
  grep -E "Failed|\*\*\*" "$OUT/ctest_nccl.log" | head -10
  LOGDIR=/tmp/dp_sweep timeout 400 bash bench/run_dp_sweep.sh --build build-gpu --gpus "${DP_GPUS:-2}" \
    "b6M||--overlap --bucket 6250000" "b6M_ce||--overlap --bucket 6250000 --copy-engine" \
    "b25M||--overlap --bucket 25000000" "b25M_ce||--overlap --bucket 25000000 --copy-engine" \
    "one_bucket||--bucket 500000000" 2>&1 | tee "$OUT/dp_sweep.log"
  summary+=("dp sweep rc=$?")
fi
printf '%s\n' "== summary" "${summary[@]}"
