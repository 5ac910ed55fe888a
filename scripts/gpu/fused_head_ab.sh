#!/usr/bin/env bash
# On one GPU: the fused head (dscpp.fused_head: dp_bench --fused-head; Note [Fused head]) against the default,
# interleaved rounds of dp_bench (20 timed steps each), tokens/s and the allocator's peak; then the same with a Llama 3
# vocabulary (128256), where the logits dominate the peak. Expects build-gpu (scripts/gpu/check.sh build).
#   bash scripts/gpu/fused_head_ab.sh 2>&1 | tail -20
set -uo pipefail
cd "$(dirname "$0")/../.."
[ -d .carry/root/usr/lib ] && export LD_LIBRARY_PATH=$PWD/.carry/root/usr/lib:${LD_LIBRARY_PATH:-}
cudnn_lib=$(grep -E "^CUDNN_LIBRARY:" build-gpu/CMakeCache.txt 2>/dev/null | cut -d= -f2)
[ -f "$cudnn_lib" ] && export LD_LIBRARY_PATH=$(dirname "$cudnn_lib"):$LD_LIBRARY_PATH
bench=./build-gpu/bench/dp_bench
[ -x "$bench" ] || { echo "fused_head_ab.sh: no $bench (run scripts/gpu/check.sh build first)" >&2; exit 1; }
echo "model B fused tokens/s/GPU ms/step peak_GiB"
for round in 1 2; do
  for spec in "llama-1b 16" "gpt2-medium 32" "llama-1b 8 --n-vocab 128256"; do
    set -- $spec
    for fused in 0 1; do
      flag=""; [ "$fused" = 1 ] && flag=--fused-head
      row=$(timeout 150 "$bench" --model "$1" --batch "$2" "${@:3}" $flag --seq 1024 --steps 20 \
            --warmup 3 2>/dev/null | grep RESULT | head -1)
      echo "$1${3:+ V=128256} $2 $fused $(awk -F'\t' '{print $8, $9, $10}' <<< "$row") (round $round)"
    done
  done
done
