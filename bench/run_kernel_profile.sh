#!/usr/bin/env bash
# Where one training step's GPU time goes, our engine next to torch.compile, as one markdown table by kernel
# category (bench/kernel_table.py) plus each side's top kernels. Usage:
#   bash bench/run_kernel_profile.sh [--build build-gpu] [--model gpt2] [--batch 32] [--seq 1024] [--top 15]
#                                    [--gemm-tflops 678] [--ncu PATH] [--no-torch]
# Ours: Nsight Compute over the one step that train_bench --nvtx-step wraps in the NVTX range "dscpp_step" (kernel
# durations gpu__time_duration.sum; ncu serialises kernels, clocks and caches left alone). torch.compile: one step
# under torch.profiler (CUPTI; ncu would also follow Inductor's compile workers), train_torch.py --profile-step.
# Step wall times: the median step of a separate, unprofiled run of each. Files and logs: ${OUT:-/tmp/kprof}.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
build="$root/build" model=gpt2 batch=32 seq=1024 top=15 gemm_peak=678 ncu="" run_torch=1
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --model) model="$2"; shift 2 ;;
    --batch) batch="$2"; shift 2 ;;
    --seq) seq="$2"; shift 2 ;;
    --top) top="$2"; shift 2 ;;
    --gemm-tflops) gemm_peak="$2"; shift 2 ;;
    --ncu) ncu="$2"; shift 2 ;;
    --no-torch) run_torch=0; shift ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "run_kernel_profile.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
case "$build" in /*) ;; *) build="$PWD/$build" ;; esac
die() { echo "run_kernel_profile.sh: $*" >&2; exit 1; }

out="${OUT:-/tmp/kprof}"
mkdir -p "$out" || die "cannot create $out"
bin="$build/bench/train_bench"
[ -x "$bin" ] || die "train_bench not found at $bin (configure with -DDSCPP_CUDA=ON, build target bench/train_bench)"
if [ -z "$ncu" ]; then
  ncu="$(command -v ncu || true)"
  for c in /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu; do
    [ -z "$ncu" ] && [ -x "$c" ] && ncu="$c"
  done
fi
[ -n "$ncu" ] && [ -x "$ncu" ] ||
  die "Nsight Compute (ncu) not found: not on PATH, not /usr/local/cuda/bin/ncu, not /opt/nvidia/nsight-compute/*/ncu; pass --ncu PATH"

# ms_per_step (column 7) of the first RESULT row in $1; dies on OOM/ERROR or no row.
step_ms() {
  local ms
  ms="$(awk -F'\t' '$1 == "RESULT" { print $7; exit }' "$1")"
  case "$ms" in ''|OOM|ERROR) die "no step time in $1 (got '${ms:-nothing}'; see ${1%.out}.err)" ;; esac
  echo "$ms"
}

args=(--models "$model" --batch "$batch" --seq "$seq")
echo "== dscpp: step time ($out/dscpp.err)" >&2
"$bin" "${args[@]}" --warmup 3 --steps 10 > "$out/dscpp.out" 2> "$out/dscpp.err"
ours_ms="$(step_ms "$out/dscpp.out")" || exit 1

echo "== dscpp: ncu over one step ($out/ncu.log)" >&2
rm -f "$out/dscpp.ncu-rep"
"$ncu" --nvtx --nvtx-include "dscpp_step/" --clock-control none --cache-control none \
  --metrics gpu__time_duration.sum -f -o "$out/dscpp" \
  "$bin" "${args[@]}" --warmup 3 --steps 1 --nvtx-step > "$out/ncu.log" 2>&1 ||
  die "ncu failed (exit $?); see $out/ncu.log"
[ -s "$out/dscpp.ncu-rep" ] || die "ncu wrote no report (no kernel in the range dscpp_step?); see $out/ncu.log"
"$ncu" --import "$out/dscpp.ncu-rep" --csv --page raw --print-units base > "$out/dscpp_kernels.csv" 2> "$out/ncu_import.err" ||
  die "ncu --import failed; see $out/ncu_import.err"

cmp=()
if [ "$run_torch" = 1 ]; then
  echo "== torch.compile: step time and one profiled step ($out/torch.err)" >&2
  rm -f "$out/torch_kernels.json"
  python3 "$here/train_torch.py" "${args[@]}" --modes compile --warmup 3 --steps 10 \
    --profile-step "$out/torch_kernels.json" > "$out/torch.out" 2> "$out/torch.err"
  torch_ms="$(step_ms "$out/torch.out")" || exit 1
  [ -s "$out/torch_kernels.json" ] || die "train_torch.py wrote no $out/torch_kernels.json; see $out/torch.err"
  cmp=(--compare "$out/torch_kernels.json" --compare-label torch-compile --compare-step-ms "$torch_ms")
fi

# GEMM work of one step (TFLOP): 6 flops per weight-matrix element per token (forward 2, backward 4) over the
# linear layers and the lm head; attention's QK^T and PV belong to the attention kernels.
gemm_tflop="$(python3 - "$here" "$model" "$batch" "$seq" <<'EOF'
import sys
sys.path.insert(0, sys.argv[1])
from train_torch import PRESETS
arch, L, C, H, Hkv, FF, V = PRESETS[sys.argv[2]]
B, T = int(sys.argv[3]), int(sys.argv[4])
layer = 4 * C * C + 2 * C * FF if arch == "gpt2" else 2 * C * C + 2 * C * (C // H * Hkv) + 3 * C * FF
print(6 * B * T * (L * layer + V * C) / 1e12)
EOF
)" || die "unknown model '$model' for the GEMM work (see PRESETS in bench/train_torch.py)"

python3 "$here/kernel_table.py" "$out/dscpp_kernels.csv" --label dscpp --step-ms "$ours_ms" ${cmp[@]+"${cmp[@]}"} \
  --top "$top" --gemm-tflop "$gemm_tflop" --gemm-peak "$gemm_peak" > "$out/table.md" || die "kernel_table.py failed"
echo "### $model, B=$batch, T=$seq: kernel time of one training step"
echo
cat "$out/table.md"
echo "(files and logs: $out)" >&2
