#!/usr/bin/env bash
# On a GPU machine: `dscpp train --device cuda` end to end (tokenizer, bf16 training, checkpoint, samples), then the
# same in fp16 and in f32 on the GPU and on the CPU for a few steps, printing the loss lines. Usage:
#   scripts/gpu/smoke_train.sh <build dir> <text file>
set -uo pipefail
build=${1:-build-gpu}
text=${2:-.carry/corpus.txt}
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
cfg() {  # $1 = precision section
  cat <<JSON
{"train_micro_batch_size_per_gpu": 16, "gradient_accumulation_steps": 1,
 "optimizer": {"type": "AdamW", "params": {"lr": 2e-3, "betas": [0.9, 0.95], "weight_decay": 0.1}},
 "scheduler": {"type": "WarmupCosineLR", "params": {"warmup_num_steps": 20, "total_num_steps": 200}},
 "gradient_clipping": 1.0, "steps_per_print": 25 $1}
JSON
}
cfg ', "bf16": {"enabled": true}' > "$OUT/bf16.json"
cfg ', "fp16": {"enabled": true, "initial_scale_power": 12}' > "$OUT/fp16.json"
cfg '' > "$OUT/f32.json"
for run in "cuda bf16" "cuda fp16" "cuda f32" "cpu f32"; do
  set -- $run
  steps=200; [ "$1" = cpu ] && steps=50
  echo "== $1 $2"
  timeout 240 "$build/dscpp" train --device "$1" --config "$OUT/$2.json" --data "$text" --vocab-size 2048 \
    --steps $steps --out "$OUT/run_$1_$2" --overwrite --samples 1 --eval-every 0 >"$OUT/train_$1_$2.log" 2>&1
  echo "rc=$?"; grep -E "val loss|tokens/s;|error" "$OUT/train_$1_$2.log" | tail -4
done
