#!/usr/bin/env bash
# On a GPU machine: the decode GEMV's A/B (loads in cp.async against loads in registers, Note [Decode GEMV, loads in
# flight]) in one call (< 600 s). Stages (default: all):
#   build    a fresh sm_90a build (scripts/gpu/check.sh build)
#   ops      the op harness on the ops the GEMV and cp.async serve (matmul, quantized matmul, attention)
#   gemm     gemm_bench decode: the Llama-3.1-8B shape's decode linears, CUDA cores / registers / cp.async
#   e2e      inference_bench batch 1 and 8, Llama-3.1-8B and 3.2-1B shapes, bf16 / int8 / int4, both GEMVs
#   profile  one 8B batch-1 run per weight type under the CUPTI tracer: GPU time per kernel and per token
#   train    dscpp train on GPT-2 124M's shape, its built-in config (bf16 on cuda) against the same config in f32
#            (needs a text file: TRAIN_TEXT, default gpu-data/fortunes.txt)
# Before the call: bash scripts/gpu/prepare-carry.sh; run with carry [".carry"].
set -uo pipefail
default_steps=(build ops gemm e2e profile train)
source "$(dirname "$0")/stages.sh"
models=$(mktemp -d)
for m in llama-3.1-8b llama-3.2-1b; do mkdir -p "$models/$m" && cp "bench/models/$m.json" "$models/$m/config.json"; done
ib() { ./build-gpu/bench/inference_bench --prompt 32 --new 128 "$@"; }
if want ops; then
  for op in matmul_forward matmul_q_forward attention_forward attention_backward; do
    timeout 200 ./build-gpu/tests/test_ops --op $op > "$OUT/test_ops_$op.log" 2>&1
    echo "test_ops --op $op rc=$?: $(grep -E 'passed' "$OUT/test_ops_$op.log" | tail -1)"
    grep -E "FAIL" "$OUT/test_ops_$op.log" | head -5
  done
  el ops
fi
if want gemm; then
  timeout 200 ./build-gpu/bench/gemm_bench decode > "$OUT/gemm_decode.log" 2>&1
  echo "gemm_bench decode rc=$?"; grep -A30 "^decode linears" "$OUT/gemm_decode.log"
  el gemm
fi
if want e2e; then
  for m in llama-3.1-8b llama-3.2-1b; do
    for w in dense int8 int4; do
      for g in async registers; do
        timeout 120 ib --model "$models/$m" --weights $w --batch 1,8 --gemv $g > "$OUT/e2e-$m-$w-$g.out" \
          2> "$OUT/e2e-$m-$w-$g.err" || echo "inference_bench $m $w $g rc=$?"
        grep -vE "^#|^$" "$OUT/e2e-$m-$w-$g.out" | grep -v "^impl" | sed "s/^/$g /"
      done
    done
  done
  el e2e
fi
if want profile; then
  trace=build-gpu/bench/libdscpp_cupti_trace.so
  for w in dense int4; do
    CUDA_INJECTION64_PATH=$trace DSCPP_CUPTI_OUT=$OUT/decode-$w.csv timeout 120 ib --model "$models/llama-3.1-8b" \
      --weights $w --batch 1 --warmup 0 > "$OUT/profile-$w.out" 2>&1
    echo "== 8B batch 1 $w: GPU time per token (128 decode steps; the last half of the trace)"
    python3 scripts/gpu/kernel_sum.py "$OUT/decode-$w.csv" --frac 0.5 --steps 64 --top 14
  done
  el profile
fi
if want train; then
  text=${TRAIN_TEXT:-gpu-data/fortunes.txt}
  ./build-gpu/dscpp train --help >/dev/null 2>&1
  f32cfg=$(mktemp --suffix=.json)
  # The built-in config without bf16: what `dscpp train --device cuda` ran before it turned bf16 on.
  ./build-gpu/dscpp train --device cuda --model gpt2 --data "$text" --seq-len 512 --steps 60 --eval-every 0 \
    --samples 0 --out "$OUT/train-bf16" > "$OUT/train-bf16.log" 2>&1
  echo "train built-in (bf16) rc=$?: $(grep -E '^step +60' "$OUT/train-bf16.log")"
  python3 - "$f32cfg" <<'PY'
import json, sys
json.dump({"train_micro_batch_size_per_gpu": 16, "gradient_accumulation_steps": 1,
           "optimizer": {"type": "AdamW", "params": {"lr": 2e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}},
           "scheduler": {"type": "WarmupCosineLR", "params": {"warmup_num_steps": 13, "total_num_steps": 60,
                                                             "warmup_min_ratio": 0.0, "cos_min_ratio": 0.1}},
           "gradient_clipping": 1.0, "steps_per_print": 10}, open(sys.argv[1], "w"))
PY
  ./build-gpu/dscpp train --device cuda --model gpt2 --data "$text" --seq-len 512 --steps 60 --eval-every 0 \
    --samples 0 --config "$f32cfg" --out "$OUT/train-f32" > "$OUT/train-f32.log" 2>&1
  echo "train f32 config rc=$?: $(grep -E '^step +60' "$OUT/train-f32.log")"
  rm -rf "$OUT"/train-*/checkpoints "$OUT"/train-*/data
  el train
fi
