#!/usr/bin/env bash
# Data parallelism, ours next to PyTorch, on this machine's GPUs; prints one table. For N in --gpus (those present):
#   ours:  dscpp launch --num_gpus N -- dp_bench   (GPT-2 124M and 350M, engine + NCCL gradient averaging)
#   torch: torchrun ddp_torch.py                    (the same models, micro-batch and T; DDP, eager or compiled)
#   and for N >= 2 the all_reduce bandwidth of both: allreduce_bench and allreduce_torch.py (1 MiB..1 GiB, bf16, f32).
# The N = max run of dp_bench also writes a Chrome trace of a warm-up step per model and rank; scripts/check_trace.py
# then reports how much of the gradient all-reduce time the backward compute hides.
# Usage: bench/run_dp_bench.sh [--build DIR (default build-gpu, else build)] [--gpus "1 2 4"] [--models gpt2,gpt2-medium]
#          [--batch 32] [--seq 1024] [--steps 10] [--warmup 3] [--compile] [--overlap] [--bucket ELEMS]
#          [--no-torch] [--no-dscpp] [--no-allreduce]
# Logs and raw output: $LOGDIR (default: a new directory under ${TMPDIR:-/tmp}). Budget: about 4 minutes on 4 GPUs
# with the defaults (torch eager); --compile adds roughly a minute of compilation per torch run.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
build="$root/build"
[ -x "$root/build-gpu/bench/dp_bench" ] && build="$root/build-gpu"  # scripts/gpu/check.sh's build
gpus="1 2 4" models="gpt2,gpt2-medium" batch=32 seq=1024 steps=10 warmup=3
compile=0 overlap=0 bucket=0 run_torch=1 run_dscpp=1 run_ar=1
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --gpus) gpus="$2"; shift 2 ;;
    --models) models="$2"; shift 2 ;;
    --batch) batch="$2"; shift 2 ;;
    --seq) seq="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --warmup) warmup="$2"; shift 2 ;;
    --compile) compile=1; shift ;;
    --overlap) overlap=1; shift ;;
    --bucket) bucket="$2"; shift 2 ;;
    --no-torch) run_torch=0; shift ;;
    --no-dscpp) run_dscpp=0; shift ;;
    --no-allreduce) run_ar=0; shift ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "run_dp_bench.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
case "$build" in /*) ;; *) build="$PWD/$build" ;; esac

# Libraries the GPU image lacks may be unpacked under .carry/root (as scripts/gpu/check.sh).
[ -d "$root/.carry/root/usr/lib" ] && export LD_LIBRARY_PATH="$root/.carry/root/usr/lib:${LD_LIBRARY_PATH:-}"
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}  # NVLink multicast off on both sides (our backend's default)
LOGDIR=${LOGDIR:-$(mktemp -d "${TMPDIR:-/tmp}/dp_bench.XXXXXX")}
mkdir -p "$LOGDIR"
: > "$LOGDIR/results.tsv"

have=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
[ "${have:-0}" -ge 1 ] || { echo "run_dp_bench.sh: no GPU found (nvidia-smi -L)" >&2; exit 1; }
ns=()
for n in $gpus; do [ "$n" -le "$have" ] && ns+=("$n"); done
[ ${#ns[@]} -gt 0 ] || { echo "run_dp_bench.sh: none of --gpus '$gpus' fits the $have GPU(s) here" >&2; exit 1; }
nmax=${ns[$((${#ns[@]} - 1))]}
echo "== $have GPU(s): $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); N = ${ns[*]}; logs: $LOGDIR" >&2

dscpp="$build/dscpp"
torchrun=(python3 -m torch.distributed.run --standalone)
common=(--models "$models" --batch "$batch" --seq "$seq" --steps "$steps" --warmup "$warmup")
ours=("${common[@]}" --bucket "$bucket")
[ "$overlap" = 1 ] && ours+=(--overlap)
theirs=("${common[@]}")
[ "$compile" = 1 ] && theirs+=(--compile)

# run NAME TIMEOUT CMD...: stdout to NAME.out, stderr to NAME.err; RESULT lines collected (without the launcher's
# "[rank r] " prefix).
run() {
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  echo "== $name: $*" >&2
  # --foreground: the job stays in the caller's process group, so a caller's timeout or Ctrl-C stops it too
  # (a nested timeout starts its own group, and a torchrun left behind would run beside the next measurement).
  timeout --foreground -k 10 "$limit" "$@" > "$LOGDIR/$name.out" 2> "$LOGDIR/$name.err"
  local rc=$?
  [ $rc -ne 0 ] && echo "   $name exited with $rc (see $LOGDIR/$name.err): $(tail -1 "$LOGDIR/$name.err")" >&2
  grep -E '^(\[rank [0-9]+\] )?RESULT' "$LOGDIR/$name.out" | sed -E 's/^\[rank [0-9]+\] //' >> "$LOGDIR/results.tsv"
  echo "   $name: $((SECONDS - t0)) s" >&2
}

launch() {  # launch N: sets the array L to our launcher on this machine only (no hostfile), a free port
  L=("$dscpp" launch --hostfile "$LOGDIR/no-hostfile" --num_gpus "$1" --master_port 0 --)
}

if [ "$run_dscpp" = 1 ] && { [ ! -x "$dscpp" ] || [ ! -x "$build/bench/dp_bench" ]; }; then
  echo "run_dp_bench.sh: $dscpp or $build/bench/dp_bench missing (build with -DDSCPP_CUDA=ON: targets dscpp dp_bench" \
       "allreduce_bench); ours is skipped" >&2
  run_dscpp=0
fi
for n in "${ns[@]}"; do
  if [ "$run_dscpp" = 1 ]; then
    trace=()
    [ "$n" = "$nmax" ] && [ "$n" -gt 1 ] && [ "$warmup" -ge 2 ] && trace=(--trace "$LOGDIR/trace.json")
    launch "$n"
    run "dscpp_dp_$n" 420 "${L[@]}" "$build/bench/dp_bench" "${ours[@]}" ${trace[@]+"${trace[@]}"}
  fi
  if [ "$run_torch" = 1 ]; then
    run "torch_ddp_$n" 480 "${torchrun[@]}" --nproc_per_node "$n" "$here/ddp_torch.py" "${theirs[@]}"
  fi
  if [ "$run_ar" = 1 ] && [ "$n" -gt 1 ]; then
    launch "$n"
    [ "$run_dscpp" = 1 ] && [ -x "$build/bench/allreduce_bench" ] &&
      run "dscpp_allreduce_$n" 240 "${L[@]}" "$build/bench/allreduce_bench"
    [ "$run_torch" = 1 ] && run "torch_allreduce_$n" 240 "${torchrun[@]}" --nproc_per_node "$n" "$here/allreduce_torch.py"
  fi
done

# Overlap of the gradient all-reduce with compute in the traced step (our engine, N = max).
for f in "$LOGDIR"/trace.json.*.rank0; do
  [ -e "$f" ] || continue
  base=${f%.rank0}
  echo "== trace ${base##*/} (step 1 of dp_bench x$nmax): scripts/check_trace.py $base.rank*"
  python3 "$root/scripts/check_trace.py" "$base".rank* || true
done

# One table from the RESULT lines (training: impl model world B T tps_total tps_gpu ms peak;
# all_reduce: impl op dtype world bytes us algbw busbw).
python3 - "$LOGDIR/results.tsv" <<'PY'
import sys
train, ar = {}, {}
for line in open(sys.argv[1]):
    f = line.rstrip("\n").split("\t")
    if len(f) >= 9 and f[2] == "all_reduce" and f[1] in ("dscpp", "torch"):
        ar[(f[1], f[3], int(f[4]), int(f[5]))] = (float(f[6]), float(f[7]), float(f[8]))
    elif len(f) >= 10:
        impl = "dscpp" if f[1] == "dscpp" else "torch"
        train[(impl, f[2], int(f[3]))] = (f[1], f[6], f[7], f[8], f[9])
num = lambda s: float(s) if s.replace(".", "", 1).isdigit() else None
ns = sorted({k[2] for k in train} | {k[2] for k in ar})
models = sorted({k[1] for k in train}, key=lambda m: ("gpt2", "gpt2-medium", "llama-1b").index(m)
                if m in ("gpt2", "gpt2-medium", "llama-1b") else 9)
GIB = 1 << 30
def bw(impl, dt, n):
    v = ar.get((impl, dt, n, GIB))
    return f"{v[2]:.1f}" if v else "-"
def row(impl, m, n):
    r = train.get((impl, m, n))
    if not r:
        return "-", "-", "-", "-"
    tot, per = num(r[1]), num(r[2])
    base = num(train[(impl, m, 1)][2]) if (impl, m, 1) in train else None
    eff = f"{100 * per / base:.1f}%" if per and base else ("-" if n > 1 else "100%")
    return (r[1], r[2], eff, r[4])
torch_impl = next((v[0] for k, v in train.items() if k[0] == "torch"), "torch")
print(f"\nData parallel, micro-batch per GPU and T as given; ours = dscpp dp_bench, torch = {torch_impl}; "
      "scaling = tokens/s per GPU / the 1-GPU run; busbw = all_reduce bus bandwidth at 1 GiB (GB/s)")
hdr = ["N", "model", "ours tok/s", "ours /GPU", "ours scal", "torch tok/s", "torch /GPU", "torch scal", "ours/torch",
       "peak GiB o/t", "busbw bf16 o/t", "busbw f32 o/t"]
w = [3, 12, 11, 10, 9, 11, 10, 10, 10, 12, 14, 14]
print(" ".join(h.rjust(x) for h, x in zip(hdr, w)))
for n in ns:
    for m in models:
        o, t = row("dscpp", m, n), row("torch", m, n)
        ratio = f"{num(o[0]) / num(t[0]):.3f}x" if num(o[0]) and num(t[0]) else "-"
        cells = [str(n), m, o[0], o[1], o[2], t[0], t[1], t[2], ratio, f"{o[3]}/{t[3]}",
                 f"{bw('dscpp', 'bf16', n)}/{bw('torch', 'bf16', n)}", f"{bw('dscpp', 'f32', n)}/{bw('torch', 'f32', n)}"]
        print(" ".join(c.rjust(x) for c, x in zip(cells, w)))
if ar:
    print("\nall_reduce busbw GB/s (time us), ours / torch")
    sizes = sorted({k[3] for k in ar})
    print("   N dtype " + " ".join(f"{s >> 20:>8} MiB".rjust(26) for s in sizes))
    for n in sorted({k[2] for k in ar}):
        for dt in ("bf16", "f32"):
            cells = []
            for s in sizes:
                o, t = ar.get(("dscpp", dt, n, s)), ar.get(("torch", dt, n, s))
                fo = f"{o[2]:.1f} ({o[0]:.0f})" if o else "-"
                ft = f"{t[2]:.1f} ({t[0]:.0f})" if t else "-"
                cells.append(f"{fo} / {ft}".rjust(26))
            print(f"{n:>4} {dt:>5} " + " ".join(cells))
PY
echo "(raw output and logs: $LOGDIR)" >&2
