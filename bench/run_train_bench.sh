#!/usr/bin/env bash
# Trains the same models with our engine (train_bench) and with PyTorch (train_torch.py, eager and torch.compile)
# back to back on this machine's GPU, then prints one table. Usage:
#   bench/run_train_bench.sh [--build DIR] [--models gpt2,gpt2-medium,llama-1b] [--batch 32] [--seq 1024]
#                            [--steps 10] [--warmup 3] [--gemm-tflops 678] [--no-torch] [--no-dscpp]
#                            [--attention auto|own|cudnn[,...]]  (ours once per attention backend, e.g. own,cudnn)
#                            [--torch-modes eager,compile]
# A model that does not fit shows OOM; a failed run shows ERROR (its log is in the stderr files named below).
set -u
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
build="$root/build"
models="gpt2,gpt2-medium,llama-1b"
batch=32 seq=1024 steps=10 warmup=3 gemm=0 run_torch=1 run_dscpp=1 attention=auto torch_modes=eager,compile
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --models) models="$2"; shift 2 ;;
    --batch) batch="$2"; shift 2 ;;
    --seq) seq="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --warmup) warmup="$2"; shift 2 ;;
    --gemm-tflops) gemm="$2"; shift 2 ;;
    --no-torch) run_torch=0; shift ;;
    --no-dscpp) run_dscpp=0; shift ;;
    --attention) attention="$2"; shift 2 ;;
    --torch-modes) torch_modes="$2"; shift 2 ;;
    -h|--help) sed -n '2,6p' "$0"; exit 0 ;;
    *) echo "run_train_bench.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done

out="$(mktemp -d "${TMPDIR:-/tmp}/train_bench.XXXXXX")"
common=(--models "$models" --batch "$batch" --seq "$seq" --steps "$steps" --warmup "$warmup" --gemm-tflops "$gemm")

if [ "$run_dscpp" = 1 ]; then
  bin="$build/bench/train_bench"
  if [ -x "$bin" ]; then
    for be in ${attention//,/ }; do
      echo "== dscpp: $bin --attention $be (log: $out/dscpp-$be.err)" >&2
      "$bin" "${common[@]}" --attention "$be" > "$out/dscpp-$be.raw" 2> "$out/dscpp-$be.err" ||
        echo "train_bench exited with $?" >&2
      # One backend keeps train_bench's name; several get the backend appended (dscpp-bf16+cudnn).
      if [ "$attention" = "$be" ]; then cp "$out/dscpp-$be.raw" "$out/dscpp-$be.out"
      else awk -F'\t' -v OFS='\t' -v be="$be" '$1 == "RESULT" { $2 = $2 "+" be } { print }' "$out/dscpp-$be.raw" > "$out/dscpp-$be.out"; fi
    done
  else
    echo "train_bench not found at $bin (build with -DDSCPP_CUDA=ON, target train_bench)" >&2
  fi
fi
if [ "$run_torch" = 1 ]; then
  echo "== torch: $here/train_torch.py (log: $out/torch.err)" >&2
  python3 "$here/train_torch.py" "${common[@]}" --modes "$torch_modes" > "$out/torch.out" 2> "$out/torch.err" ||
    echo "train_torch.py exited with $? (see $out/torch.err)" >&2
fi

# One table: the RESULT rows of both, grouped by model, with dscpp's speed-up over torch.compile per model.
cat "$out"/*.out 2>/dev/null | awk -F'\t' '
  $1 == "RESULT" { n++; impl[n] = $2; model[n] = $3; row[n] = $0; tps[$3 "|" $2] = $6; if (!($3 in seen)) { seen[$3] = 1; order[++m] = $3 } }
  END {
    printf "%-14s %-12s %4s %5s %12s %9s %7s %10s %9s %10s\n", "impl", "model", "B", "T", "tokens/s", "ms/step", "MFU%", "MFU%gemm", "peakGiB", "vs.compile"
    for (k = 1; k <= m; k++) for (i = 1; i <= n; i++) if (model[i] == order[k]) {
      split(row[i], f, "\t"); ref = tps[f[3] "|torch-compile"]; sp = "-"
      if (ref + 0 > 0 && f[6] + 0 > 0) sp = sprintf("%.2fx", f[6] / ref)
      printf "%-14s %-12s %4s %5s %12s %9s %7s %10s %9s %10s\n", f[2], f[3], f[4], f[5], f[6], f[7], f[8], f[9], f[10], sp
    }
  }'
echo "(raw output and logs: $out)" >&2
