#!/usr/bin/env bash
# Checkpoint save/load speed on this machine (docs/PERF.md): ckpt_bench on the GPU (bf16) and on the CPU (f32),
# each into a fresh folder under $TMPDIR (removed afterwards), then the Hugging Face interop test
# (tests/python/test_hf_transformers.py) when python3 has torch and transformers. Usage:
#   bench/run_ckpt_bench.sh [--build DIR] [--model llama-1b] [--cpu-model llama-1b] [--devices cuda,cpu]
#                           [--no-hf] [-- extra ckpt_bench arguments]
# The CPU run of llama-1b needs ~40 GB of host memory (f32 states + the async snapshot) and ~30 GB of disk under
# $TMPDIR (two tags of ~15 GB); the GPU run ~35 GB of disk (two tags of ~17 GB): point TMPDIR at a disk with room. $PYTHON (default python3) runs the interop test.
# Exit status: non-zero if any part failed.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
build="$root/build"
model="llama-1b"
cpu_model=""
devices="cuda,cpu"
run_hf=1
py="${PYTHON:-python3}"
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --model) model="$2"; shift 2 ;;
    --cpu-model) cpu_model="$2"; shift 2 ;;
    --devices) devices="$2"; shift 2 ;;
    --no-hf) run_hf=0; shift ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,8p' "$0"; exit 0 ;;
    *) echo "run_ckpt_bench.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
[ -n "$cpu_model" ] || cpu_model="$model"
build="$(cd "$build" 2>/dev/null && pwd || echo "$build")"

bin=""
for b in "$build/ckpt_bench" "$build/bench/ckpt_bench"; do
  if [ -x "$b" ]; then bin="$b"; break; fi
done
work="$(mktemp -d "${TMPDIR:-/tmp}/ckpt_bench.XXXXXX")"
trap 'rm -rf "$work"' EXIT
status=0
tables=()

if [ -z "$bin" ]; then
  echo "ckpt_bench not found in $build (build the target ckpt_bench)" >&2
  status=1
else
  IFS=, read -r -a devs <<< "$devices"
  for dev in "${devs[@]}"; do
    m="$model"
    [ "$dev" = cpu ] && m="$cpu_model"
    echo "== ckpt_bench --device $dev --model $m (in $work/$dev)"
    log="$work/$dev.log"
    "$bin" --device "$dev" --model "$m" --dir "$work/$dev" "${extra[@]}" 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
    [ "$rc" = 0 ] || { echo "ckpt_bench --device $dev exited with $rc"; status=1; }
    rm -rf "${work:?}/$dev"
    # The table: from its title line to the end of the output.
    table="$(sed -n '/^ckpt_bench: .*world size 1; tag/,$p' "$log")"
    tables+=("${table:-ckpt_bench --device $dev --model $m: no table (exit status $rc; see above)}")
  done
fi

if [ "$run_hf" = 1 ]; then
  dscpp="$build/dscpp"
  echo
  if [ ! -x "$dscpp" ]; then
    echo "== HF interop test: skipped (no dscpp binary at $dscpp)"
  elif ! "$py" -c "import torch, transformers" 2>/dev/null; then
    echo "== HF interop test: skipped ($py lacks torch or transformers: pip install torch transformers)"
  else
    echo "== $py tests/python/test_hf_transformers.py --dscpp $dscpp"
    if "$py" "$root/tests/python/test_hf_transformers.py" --dscpp "$dscpp"; then
      echo "HF interop test: passed"
    else
      echo "HF interop test: FAILED"
      status=1
    fi
  fi
fi

echo
echo "== summary"
for t in "${tables[@]}"; do
  printf '%s\n\n' "$t"
done
exit "$status"
