#!/usr/bin/env bash
# On a GPU machine: the serving issue's figures in one call. A dummy-weight model folder of a config.json shape with
# a synthetic tokenizer of its vocabulary (bench/synthetic_tokenizer.py), `dscpp serve` on it, then
# bench/serve_bench.py (vLLM's benchmark_serving metrics) at --rate requests/s and at saturation, random prompts of
# exact token ids; then the engine's offline throughput on the same lengths without HTTP (inference_bench
# --offline), for the server's own overhead. Usage (after scripts/gpu/check.sh build or inference.sh build):
#   bash scripts/gpu/serve.sh [--model llama-3.1-8b] [--device cuda] [--rate 4] [--prompts 200] [--input 1024]
#                             [--output 128] [--build build-gpu] [--config engine.json] [--tag NAME]
# --config: the engine's JSON config for the server (e.g. a larger SplitFuse token budget; the offline run keeps the defaults);
# --tag names the result files when several runs share $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-out}
model=llama-3.1-8b device=cuda rate=4 prompts=200 input=1024 output=128 build=build-gpu port=18200 config= tag=
while [ $# -gt 0 ]; do
  case "$1" in
    --model) model="$2"; shift 2 ;;
    --device) device="$2"; shift 2 ;;
    --rate) rate="$2"; shift 2 ;;
    --prompts) prompts="$2"; shift 2 ;;
    --input) input="$2"; shift 2 ;;
    --output) output="$2"; shift 2 ;;
    --build) build="$2"; shift 2 ;;
    --config) config="$2"; shift 2 ;;
    --tag) tag="_$2"; shift 2 ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "serve.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
mkdir -p "$OUT"
cfg=()
[ -n "$config" ] && cfg=(--config "$(realpath "$config")")
[ -d .carry/root/usr/lib ] && export LD_LIBRARY_PATH=$PWD/.carry/root/usr/lib:${LD_LIBRARY_PATH:-}
dir=$(mktemp -d "${TMPDIR:-/tmp}/serve.XXXXXX")
cp "bench/models/$model.json" "$dir/config.json"
vocab=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['vocab_size'])" "$dir/config.json")
python3 bench/synthetic_tokenizer.py --vocab "$vocab" --out "$dir" >/dev/null
"$build/dscpp" serve --hf "$dir" --load-format dummy --device "$device" --port "$port" "${cfg[@]}" \
  > "$OUT/serve$tag.log" 2>&1 &
pid=$!
trap 'kill -TERM $pid 2>/dev/null; wait $pid 2>/dev/null' EXIT
for _ in $(seq 120); do
  curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
  kill -0 $pid 2>/dev/null || { echo "dscpp serve exited:"; tail -20 "$OUT/serve$tag.log"; exit 1; }
  sleep 1
done
for r in "$rate" inf; do
  echo "== serve_bench --request-rate $r"
  python3 bench/serve_bench.py --port "$port" --dataset random --random-prompt ids --random-input-len "$input" \
    --random-vocab-size "$vocab" \
    --random-output-len "$output" --num-prompts "$prompts" --request-rate "$r" --save-result "$OUT/serve${tag}_rate_$r.json" \
    2>&1 | grep -E "Successful|throughput|Median TTFT|Mean ITL|Median ITL|Median TPOT|P99 TTFT|Failed"
  # The server's own view, cumulative since start-up: its TTFT / ITL sums and counts, and where the engine's
  # steps went (a step's wall time against its forward's launch and wait on the device).
  curl -s "http://127.0.0.1:$port/metrics" | grep -E "^dscpp:(engine_|(time_to_first_token|inter_token_latency)_seconds_(sum|count))" |
    sed 's/{[^}]*}//' | tr '\n' ' '; echo
done
curl -s "http://127.0.0.1:$port/metrics" | grep -E "^dscpp:(num_requests|kv_cache)" | head -6
kill -TERM $pid; wait $pid; trap - EXIT
echo "== offline, no HTTP (inference_bench --offline $prompts)"
dtype=bf16
[ "$device" = cpu ] && dtype=f32
"$build/bench/inference_bench" --model "$dir" --device "$device" --dtype "$dtype" --offline "$prompts" --prompt "$input" \
  --new "$output" 2>/dev/null | grep OFFLINE
