#!/usr/bin/env bash
# Our flash attention (`attention_bench time`) next to PyTorch's flash SDPA (attention_torch.py) on the same shapes,
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
echo "== dscpp: $bin time $dtype (log: $out/ours.txt)" >&2
"$bin" time "$dtype" > "$out/ours.txt" 2> "$out/ours.err" || { echo "attention_bench exited with $?" >&2; cat "$out/ours.err" >&2; exit 1; }

# attention_bench rows: dtype B T H Hkv D | fwd_ms fwd_tf | bwd_ms bwd_tf | fb_tf
awk -v dt="$dtype" '$1 == dt && $7 == "|" && $10 == "|" { printf "%s,%s,%s,%s,%s\t%s\t%s\n", $2, $3, $4, $5, $6, $8, $11 }' \
  "$out/ours.txt" > "$out/ours.tsv"
if [ ! -s "$out/ours.tsv" ]; then
  echo "no timing rows in $out/ours.txt" >&2
  exit 1
fi
shapes="$(cut -f1 "$out/ours.tsv" | paste -sd';')"

: > "$out/torch.out"
if [ "$run_torch" = 1 ]; then
  echo "== torch: $here/attention_torch.py (log: $out/torch.err)" >&2
  python3 "$here/attention_torch.py" --shapes "$shapes" --dtype "$dtype" > "$out/torch.out" 2> "$out/torch.err" ||
    echo "attention_torch.py exited with $? (see $out/torch.err)" >&2
  head -1 "$out/torch.err" >&2
fi

# One table: join on the shape.
awk -F'\t' '
  FILENAME == ARGV[1] { if ($1 == "RESULT") { k = $3 "," $4 "," $5 "," $6 "," $7; tf[k] = $8; tfb[k] = $10; note[k] = $12 } next }
  FNR == 1 {  # the first row of ours.tsv
    printf "%-22s %9s %9s %9s %9s %9s %9s %9s %9s  %s\n", "shape B,T,H,Hkv,D", "ours fwd", "torch fwd", "ours f+b",
           "torch f+b", "fwd x", "f+b x", "ours TF/s", "torch TF/s", "(ms; x = torch/ours; TF/s of f+b)"
  }
  {
    k = $1; of = $2 + 0; ofb = $2 + $3; split(k, s, ",")
    flops = 4.0 * s[1] * s[3] * s[2] * s[2] * s[5] * 0.5
    t1 = (k in tf) ? tf[k] : "-"; t2 = (k in tfb) ? tfb[k] : "-"
    r1 = (t1 + 0 > 0) ? sprintf("%.2f", t1 / of) : "-"
    r2 = (t2 + 0 > 0) ? sprintf("%.2f", t2 / ofb) : "-"
    ttf = (t2 + 0 > 0) ? sprintf("%.1f", 3.5 * flops / t2 * 1e-9) : "-"
    n = (k in note && note[k] != "-") ? note[k] : ""
    printf "%-22s %9.3f %9s %9.3f %9s %9s %9s %9.1f %9s  %s\n", k, of, t1, ofb, t2, r1, r2, 3.5 * flops / ofb * 1e-9,
           ttf, n
  }' "$out/torch.out" "$out/ours.tsv"
echo "(raw output and logs: $out)" >&2
