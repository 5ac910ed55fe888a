#!/usr/bin/env bash
# ZeRO-Offload of the optimizer on one GPU (Note [Optimizer offload]): our engine with and without
# zero_optimization.offload_optimizer, side by side in one call, and the share of tokens/s each offload variant keeps.
#   1. cpu_adam_bench: the host's AdamW elements/s (what bounds the host step).
#   2. train_bench on Llama-1B (ZeRO stage 2, bf16, AdamW, clip 1.0) at each --tokens shape: no offload, offload,
#      offload with Twin-Flow ratios, and the delayed parameter update (plain and with a ratio).
#   3. with --big MODEL:BATCH[:GAS]: that model (e.g. bench/models/llama-3.1-8b.json:8) with activation checkpointing,
#      offloaded (its states do not fit the GPU otherwise), and its MFU.
#   4. with --deepspeed: the peers in the same call, where python3 imports torch (and deepspeed: source
#      scripts/gpu/deepspeed-env.sh first): bench/cpu_adam_peers.py beside step 1 (torch's AdamW on the CPU,
#      DeepSpeedCPUAdam, a memory triad), and bench/deepspeed_offload.py at each --tokens shape (DeepSpeed ZeRO-2
#      with and without its optimizer offload; --ds-variants offload runs only the latter).
# Usage: bash bench/run_offload_bench.sh [--build DIR] [--tokens "8:1 32:2 64c:1"] [--ratios "0.5 0.7"]
#          [--dpu-ratio 0.6] [--steps 8] [--warmup 3] [--big bench/models/llama-3.1-8b.json:8:2] [--no-dpu]
#          [--deepspeed] [--ds-variants none,offload]
#   --tokens: micro-batch:gas per shape (T = 1024); a "c" after the micro-batch turns activation checkpointing on.
# Output: one table (variant, sequences per step, tokens/s, ms/step, MFU, peak GiB, share of the same shape's
# no-offload tokens/s), the host step's time and waits per variant (from train_bench's stderr), and logs in $LOGDIR.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
build="$root/build"
[ -x "$root/build-gpu/bench/train_bench" ] && build="$root/build-gpu"
tokens="8:1 32:2 64c:1" ratios="0.5 0.7" dpu_ratio=0.6 steps=8 warmup=3 big="" dpu=1 ds=0 ds_variants=none,offload
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --tokens) tokens="$2"; shift 2 ;;
    --ratios) ratios="$2"; shift 2 ;;
    --dpu-ratio) dpu_ratio="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --warmup) warmup="$2"; shift 2 ;;
    --big) big="$2"; shift 2 ;;
    --no-dpu) dpu=0; shift ;;
    --deepspeed) ds=1; shift ;;
    --ds-variants) ds_variants="$2"; shift 2 ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "run_offload_bench.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
case "$build" in /*) ;; *) build="$PWD/$build" ;; esac
LOGDIR=${LOGDIR:-$(mktemp -d "${TMPDIR:-/tmp}/offload_bench.XXXXXX")}
mkdir -p "$LOGDIR"
bin="$build/bench/train_bench"
[ -x "$bin" ] || { echo "train_bench not found at $bin (build with -DDSCPP_CUDA=ON, target train_bench)" >&2; exit 1; }

echo "== host: $(nproc) cores; cpu_adam_bench (log: $LOGDIR/cpu_adam.out)" >&2
[ -x "$build/cpu_adam_bench" ] && "$build/cpu_adam_bench" --sizes 100000000 > "$LOGDIR/cpu_adam.out" 2>&1 &&
  cat "$LOGDIR/cpu_adam.out"
if [ "$ds" = 1 ]; then
  echo "== the peers on the host: cpu_adam_peers.py (log: $LOGDIR/cpu_adam_peers.out)" >&2
  python3 "$here/cpu_adam_peers.py" --sizes 100000000 > "$LOGDIR/cpu_adam_peers.out" 2>&1
  cat "$LOGDIR/cpu_adam_peers.out"
fi

# run NAME ARGS...: one train_bench process; its RESULT row gets NAME as the variant.
run() {
  local name="$1"; shift
  echo "== $name: train_bench $*" >&2
  "$bin" --steps "$steps" --warmup "$warmup" --zero-stage 2 "$@" > "$LOGDIR/$name.out" 2> "$LOGDIR/$name.err" ||
    echo "   exited with $? (see $LOGDIR/$name.err)" >&2
  awk -F'\t' -v OFS='\t' -v n="$name" '$1 == "RESULT" { $2 = n; print }' "$LOGDIR/$name.out" >> "$LOGDIR/results.tsv"
  # The host step and the waits of the timed steps (train_bench prints both per step).
  grep -E "host optimizer" "$LOGDIR/$name.err" | tail -n "$steps" | awk -v n="$name" '
    { for (i = 1; i <= NF; i++) { if ($i == "optimizer") h += $(i + 1); if ($i == "for") w += $(i + 1) } c++ }
    END { if (c) printf "%s\thost step %.0f ms, waited %.0f ms per step\n", n, h / c, w / c }' >> "$LOGDIR/host.tsv"
}

: > "$LOGDIR/results.tsv"
: > "$LOGDIR/host.tsv"
for shape in $tokens; do
  mb="${shape%%:*}" gas="${shape#*:}"
  ck=()
  case "$mb" in *c) mb="${mb%c}"; ck=(--checkpointing) ;; esac
  tag="llama-1b_${mb}x${gas}${ck:+c}"
  common=(--models llama-1b --batch "$mb" --gas "$gas" "${ck[@]}")
  run "$tag:none" "${common[@]}"
  run "$tag:offload" "${common[@]}" --offload cpu
  for r in $ratios; do run "$tag:offload-r$r" "${common[@]}" --offload cpu --offload-ratio "$r"; done
  if [ "$dpu" = 1 ]; then
    run "$tag:offload-dpu" "${common[@]}" --offload cpu --delayed-update
    run "$tag:offload-dpu-r$dpu_ratio" "${common[@]}" --offload cpu --delayed-update --offload-ratio "$dpu_ratio"
  fi
done
if [ "$ds" = 1 ]; then
  for shape in $tokens; do
    mb="${shape%%:*}" gas="${shape#*:}"
    echo "== DeepSpeed $shape: deepspeed_offload.py (log: $LOGDIR/ds_$shape.err)" >&2
    python3 "$here/deepspeed_offload.py" --tokens "$shape" --variants "$ds_variants" --steps "$steps" \
        --warmup "$warmup" 2> "$LOGDIR/ds_$shape.err" |
      awk -F'\t' -v OFS='\t' -v t="ds-llama-1b_${mb}x${gas}" '$1 == "RESULT" {
        $2 = t ":" ($2 == "deepspeed" ? "none" : "offload"); print }' >> "$LOGDIR/results.tsv"
  done
fi
if [ -n "$big" ]; then
  IFS=: read -r model mb gas <<< "$big"
  run "$(basename "$model" .json)_${mb}x${gas:-1}c:offload" --models "$model" --batch "$mb" --gas "${gas:-1}" \
      --checkpointing --offload cpu
fi

# One table: each variant beside its shape's no-offload tokens/s.
awk -F'\t' '
  { split($2, v, ":"); shape[NR] = v[1]; var[NR] = v[2]; row[NR] = $0; if (v[2] == "none") base[v[1]] = $6 }
  END {
    printf "%-22s %-18s %5s %10s %9s %6s %8s %7s\n", "shape", "variant", "B", "tokens/s", "ms/step", "MFU%", "peakGiB", "kept"
    for (i = 1; i <= NR; i++) {
      split(row[i], f, "\t"); kept = "-"
      if (base[shape[i]] + 0 > 0 && f[6] + 0 > 0) kept = sprintf("%.0f%%", 100 * f[6] / base[shape[i]])
      printf "%-22s %-18s %5s %10s %9s %6s %8s %7s\n", shape[i], var[i], f[4], f[6], f[7], f[8], f[10], kept
    }
  }' "$LOGDIR/results.tsv"
echo
cat "$LOGDIR/host.tsv"
echo "(raw output and logs: $LOGDIR)" >&2
