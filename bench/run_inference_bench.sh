#!/usr/bin/env bash
# Generation with our inference engine (inference_bench) and with Hugging Face generate (inference_torch.py, static
# cache eager and under torch.compile's CUDA graphs) back to back on this machine's GPU, then one table. Usage:
#   bench/run_inference_bench.sh [--build DIR] [--models llama-3.2-1b,llama-3.1-8b] [--batch 1,32] [--prompt 32]
#                                [--new 128] [--no-torch] [--torch-modes static,compile] [--offline N]
#                                [--weights dense,int8,int4]
# --offline N: offline throughput of N requests instead (ours only; inference_bench's --offline).
# --weights: ours once per weight format (int8 / int4 quantized as the model loads), one after another.
# Models are config.json shapes in bench/models/ with random (dummy) weights: no downloads.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
build="$(dirname "$here")/build"
models="llama-3.2-1b" batch="1,32" prompt=32 new=128 run_torch=1 modes="static,compile" offline="" weights="dense"
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --models) models="$2"; shift 2 ;;
    --batch) batch="$2"; shift 2 ;;
    --prompt) prompt="$2"; shift 2 ;;
    --new) new="$2"; shift 2 ;;
    --no-torch) run_torch=0; shift ;;
    --offline) offline="--offline $2"; run_torch=0; shift 2 ;;
    --torch-modes) modes="$2"; shift 2 ;;
    --weights) weights="$2"; shift 2 ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "run_inference_bench.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
out="$(mktemp -d "${TMPDIR:-/tmp}/inference_bench.XXXXXX")"
for m in ${models//,/ }; do
  dir="$out/$m"
  mkdir -p "$dir" && cp "$here/models/$m.json" "$dir/config.json"
  for w in ${weights//,/ }; do
    echo "== dscpp: inference_bench --model $m --weights $w (log: $out/dscpp-$m-$w.err)" >&2
    "$build/bench/inference_bench" --model "$dir" --weights "$w" --batch "$batch" --prompt "$prompt" --new "$new" \
      $offline > "$out/dscpp-$m-$w.out" 2> "$out/dscpp-$m-$w.err" ||
      echo "inference_bench exited with $? (see $out/dscpp-$m-$w.err)" >&2
  done
  if [ "$run_torch" = 1 ]; then
    echo "== torch: inference_torch.py --model $m (log: $out/torch-$m.err)" >&2
    python3 "$here/inference_torch.py" --model "$dir" --batch "$batch" --prompt "$prompt" --new "$new" \
      --modes "$modes" > "$out/torch-$m.out" 2> "$out/torch-$m.err" ||
      echo "inference_torch.py exited with $? (see $out/torch-$m.err)" >&2
  fi
done
cat "$out"/*.out 2>/dev/null | awk -F'\t' '
  $1 == "STARTUP" { startup = startup sprintf("start-up %s %s: %s s\n", $2, $3, $4) }
  $1 == "OFFLINE" { offline = offline sprintf("offline %s %s: %s requests of %s + %s tokens: %s total tokens/s, %s output tokens/s, %s forwards, peak %s GiB, host %s%%\n", $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) }
  END { printf "%s%s", offline, startup }
  $1 == "RESULT" { printf "%-14s %-14s %4s %6s %5s %12s %10s %8s %8s %6s\n", $2, $3, $4, $5, $6, $7, $8, $9, $10, ($11 == "" ? "-" : $11) }
  BEGIN { printf "%-14s %-14s %4s %6s %5s %12s %10s %8s %8s %6s\n", "impl", "model", "B", "prompt", "new", "tokens/s",
          "ms/step", "forwards", "peakGiB", "host%" }'
echo "(raw output and logs: $out)"
