#!/usr/bin/env bash
# Data-parallel scaling knobs, A/B in one call: dp_bench on 1 GPU (traced), then on N GPUs once per variant (traced),
# each row with its tokens/s per GPU, its scaling against the 1-GPU run, and scripts/trace_compare.py's differences
# of the traced step (GPU span, busy, outside the leaf ranges, backward leaf time: N GPUs minus 1 GPU; comm: the NCCL ops' time).
# Usage: bench/run_dp_sweep.sh [--build DIR] [--gpus 2] [--model gpt2] [--batch 32] [--seq 1024] [--steps 8]
#          VARIANT...   where VARIANT = "NAME|ENV|ARGS", e.g.
#   bench/run_dp_sweep.sh "base||--overlap --bucket 6250000" \
#                         "ce||--overlap --bucket 6250000 --copy-engine" "ring|NCCL_ALGO=Ring|--overlap --bucket 6250000"
# ENV: space-separated VAR=VALUE for our ranks; ARGS: dp_bench options. Logs and traces: $LOGDIR (default a new
# directory under ${TMPDIR:-/tmp}). About 15 s per GPT-2 124M variant on 2 H200s.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
build="$root/build"
[ -x "$root/build-gpu/bench/dp_bench" ] && build="$root/build-gpu"
gpus=2 model=gpt2 batch=32 seq=1024 steps=8
variants=()
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --gpus) gpus="$2"; shift 2 ;;
    --model) model="$2"; shift 2 ;;
    --batch) batch="$2"; shift 2 ;;
    --seq) seq="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    --*) echo "run_dp_sweep.sh: unknown option '$1'" >&2; exit 2 ;;
    *) variants+=("$1"); shift ;;
  esac
done
[ ${#variants[@]} -gt 0 ] || { echo "run_dp_sweep.sh: no VARIANT given (see --help)" >&2; exit 2; }
case "$build" in /*) ;; *) build="$PWD/$build" ;; esac
[ -d "$root/.carry/root/usr/lib" ] && export LD_LIBRARY_PATH="$root/.carry/root/usr/lib:${LD_LIBRARY_PATH:-}"
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
LOGDIR=${LOGDIR:-$(mktemp -d "${TMPDIR:-/tmp}/dp_sweep.XXXXXX")}
mkdir -p "$LOGDIR"
common=(--models "$model" --batch "$batch" --seq "$seq" --steps "$steps" --warmup 2)
# RESULT impl model world B T tok_total tok_per_gpu ms ... -> "tok_per_gpu ms"
result() { grep -h RESULT "$1" | sed -E 's/^\[rank [0-9]+\] //' | head -1 | cut -f8,9; }

"$build/bench/dp_bench" "${common[@]}" --trace "$LOGDIR/one.json" > "$LOGDIR/one.out" 2> "$LOGDIR/one.err"
read -r base base_ms <<< "$(result "$LOGDIR/one.out")"
[ -n "${base:-}" ] || { echo "run_dp_sweep.sh: the 1-GPU run failed (see $LOGDIR/one.err)" >&2; exit 1; }
printf "%-14s %12s %8s | %8s %8s %8s %9s %8s   (1 GPU: %s tokens/s, %s ms)\n" variant "tok/s/GPU" scaling \
  "span+ms" "busy+ms" "outside+" "bwd+ms" "comm ms" "$base" "$base_ms"
for v in "${variants[@]}"; do
  IFS='|' read -r name envs args <<< "$v"
  # shellcheck disable=SC2086  # ENV and ARGS are word lists by design
  env X=0 $envs timeout --foreground -k 10 180 "$build/dscpp" launch --hostfile "$LOGDIR/no-hostfile" --num_gpus "$gpus" --master_port 0 -- \
    "$build/bench/dp_bench" "${common[@]}" $args --trace "$LOGDIR/$name.json" > "$LOGDIR/$name.out" 2> "$LOGDIR/$name.err"
  read -r tok ms <<< "$(result "$LOGDIR/$name.out")"
  if [ -z "${tok:-}" ]; then
    printf "%-14s failed: %s\n" "$name" "$(grep -h -m1 -E 'error|signal|failed' "$LOGDIR/$name.err" "$LOGDIR/$name.out")"
    continue
  fi
  diff=$(python3 "$root/scripts/trace_compare.py" "$LOGDIR/one.json.$model.z0" "$LOGDIR/$name.json.$model.z0.rank0" \
         2>/dev/null | awk '/^GPU span|^busy|^outside|^leaf time, backward/ {printf "%8.2f ", $NF} /^communication/ {c=$3}
                            END {printf "%8.2f", c}')
  printf "%-14s %12s %7.1f%% | %s\n" "$name" "$tok" "$(python3 -c "print(round(100*$tok/$base, 1))")" "$diff"
done
echo "(logs and traces: $LOGDIR)" >&2
