#!/usr/bin/env bash
# Our attention (`attention_bench time`; own kernels and cuDNN's) next to PyTorch's flash SDPA (attention_torch.py) on the same shapes,
# causal, bf16 by default, as one table. "fwd+bwd" is ours forward + backward (timed apart, added) and torch's call +
# backward in one timed region; ratio = torch ms / ours ms (> 1: ours is faster). TFLOP/s as attention_bench (causal
# forward = half of 4*B*H*T^2*D, backward 2.5x). Usage:
#   bench/run_attention_bench.sh [--build DIR] [--dtype bf16|f16] [--no-torch]
set -u
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
build="$root/build"
dtype=bf16
run_torch=1
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --dtype) dtype="$2"; shift 2 ;;
    --no-torch) run_torch=0; shift ;;
    -h|--help) sed -n '2,6p' "$0"; exit 0 ;;
    *) echo "run_attention_bench.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
case "$dtype" in bf16|f16) ;; *) echo "run_attention_bench.sh: --dtype must be bf16 or f16" >&2; exit 2 ;; esac

out="$(mktemp -d "${TMPDIR:-/tmp}/attention_bench.XXXXXX")"
bin="$build/bench/attention_bench"
if [ ! -x "$bin" ]; then
  echo "attention_bench not found at $bin (build with -DDSCPP_CUDA=ON, target attention_bench)" >&2
  exit 1
fi
# Ours twice: our own kernels and cuDNN's fused attention (dscpp/kernels/attention_backend.h); the cuDNN columns
# read "-" where it is not built in.
for be in own cudnn; do
  echo "== dscpp: $bin time $dtype $be (log: $out/$be.txt)" >&2
  "$bin" time "$dtype" "$be" > "$out/$be.txt" 2> "$out/$be.err" ||
    { echo "attention_bench ($be) exited with $?" >&2; cat "$out/$be.err" >&2; exit 1; }
  # attention_bench rows: dtype B T H Hkv D | fwd_ms fwd_tf | bwd_ms bwd_tf | fb_tf
  awk -v dt="$dtype" '$1 == dt && $7 == "|" && $10 == "|" { printf "%s,%s,%s,%s,%s\t%s\t%s\n", $2, $3, $4, $5, $6, $8, $11 }' \
    "$out/$be.txt" > "$out/$be.tsv"
done
if [ ! -s "$out/own.tsv" ]; then
  echo "no timing rows in $out/own.txt" >&2
  exit 1
fi
grep -q "cuDNN attention: off" "$out/cudnn.txt" 2>/dev/null && : > "$out/cudnn.tsv"
shapes="$(cut -f1 "$out/own.tsv" | paste -sd';')"

: > "$out/torch.out"
if [ "$run_torch" = 1 ]; then
  echo "== torch: $here/attention_torch.py (log: $out/torch.err)" >&2
  python3 "$here/attention_torch.py" --shapes "$shapes" --dtype "$dtype" > "$out/torch.out" 2> "$out/torch.err" ||
    echo "attention_torch.py exited with $? (see $out/torch.err)" >&2
  head -1 "$out/torch.err" >&2
fi

# One table: join on the shape. x = torch ms / ours ms (> 1: ours is faster).
awk -F'\t' '
  FILENAME == ARGV[1] { if ($1 == "RESULT") { k = $3 "," $4 "," $5 "," $6 "," $7; tf[k] = $8; tfb[k] = $10 } next }
  FILENAME == ARGV[2] { cf[$1] = $2; cfb[$1] = $2 + $3; next }
  FNR == 1 {
    printf "%-20s %8s %8s %8s | %8s %8s %8s | %7s %7s | %7s %7s\n", "shape B,T,H,Hkv,D", "own fwd", "cudnn fwd",
           "torch fwd", "own f+b", "cudnn f+b", "torch f+b", "x own", "x cudnn", "TF own", "TF cudnn"
  }
  {
    k = $1; of = $2 + 0; ofb = $2 + $3; split(k, s, ",")
    flops = 3.5 * 4.0 * s[1] * s[3] * s[2] * s[2] * s[5] * 0.5
    t1 = (k in tf) ? tf[k] : "-"; t2 = (k in tfb) ? tfb[k] : "-"
    c1 = (k in cf) ? sprintf("%.3f", cf[k]) : "-"; c2 = (k in cfb) ? sprintf("%.3f", cfb[k]) : "-"
    xo = (t2 + 0 > 0) ? sprintf("%.2f", t2 / ofb) : "-"
    xc = (t2 + 0 > 0 && c2 != "-") ? sprintf("%.2f", t2 / c2) : "-"
    tc = (c2 != "-") ? sprintf("%.1f", flops / c2 * 1e-9) : "-"
    printf "%-20s %8.3f %8s %8s | %8.3f %8s %8s | %7s %7s | %7.1f %7s\n", k, of, c1, t1, ofb, c2, t2, xo, xc,
           flops / ofb * 1e-9, tc
  }' "$out/torch.out" "$out/cudnn.tsv" "$out/own.tsv"
echo "(ms; f+b = forward + backward; x = torch f+b / ours; TF = TFLOP/s of f+b, causal half, backward 2.5x forward)"
echo "(raw output and logs: $out)" >&2
