#!/usr/bin/env bash
# ZeRO stages on N GPUs, ours next to PyTorch FSDP2; prints one table, then the largest Llama our stage 3 trains.
#   1. for each model: dscpp launch --num_gpus N -- dp_bench --zero-stage 0,1,2,3 (overlapped reductions; stage 0 in
#      25 MB buckets as DDP; stage 3 releases every unit after use, as FSDP's reshard)
#      and torchrun fsdp_torch.py (per-block fully_shard + root, bf16 params, f32 reduce; torch.compile unless
#      --no-compile), same models, micro-batch and T.
#   2. probe: dp_bench at stage 3 (overlapped, DeepSpeed's stage-3 default) with activation checkpointing on Llama
#      shapes of growing size (3B, 7B, 13B, 20B, 24B, 28B, 30B; 1b, 29b and 31b also known; micro-batch --probe-batch), one launch each (180 s at most), 1 warm-up + 3 timed steps,
#      until one fails (out of memory: dp_bench's failing rank aborts the job, the launcher stops the others) or no
#      new shape starts after --budget seconds of the whole script.
# Usage: LOGDIR=$OUT/zero bash bench/run_zero_bench.sh [--build DIR (default build-gpu, else build)] [--gpus 4]
#          [--models "gpt2-medium llama-1b" | "gpt2-medium:32 llama-1b:16"] [--batch 8] [--seq 1024] [--steps 5] [--warmup 2] [--no-compile]
#          [--no-torch] [--no-probe] [--probe "3b 7b 13b 20b 24b 28b 30b"] [--probe-batch 4] [--budget 420]
#          [--stages 0,1,2,3] [--comm-dtype bf16 (ours: communication_data_type; FSDP2: reduce_dtype)]
#          [--copy-engine (ours: dscpp.copy_engine.enabled at stages 0, 2 and 3)]
# Output: the table (model, impl: ours zero-0..3 / torch-fsdp2, tokens/s per GPU, MFU, peak GiB = allocator peak
# (ours) or max_memory_allocated (torch), ours/FSDP2 = tokens/s per GPU against FSDP2's on the same model), the
# engine's model-state report per stage, and the probe's rows (params, tokens/s per GPU, MFU, peak GiB, or the
# error) with the largest that trained. Logs and raw output: $LOGDIR (default: a new directory under ${TMPDIR:-/tmp}).
# Budget: ~9 minutes on 4 H200s with the defaults (FSDP2 compilation ~1-2 min; the probe stops starting new shapes
# after --budget seconds of the whole script).
set -u
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
build="$root/build"
[ -x "$root/build-gpu/bench/dp_bench" ] && build="$root/build-gpu"  # scripts/gpu/check.sh's build
gpus=4 models="gpt2-medium llama-1b" batch=8 seq=1024 steps=5 warmup=2
comm_dtype="" copy_engine="" compile=1 run_torch=1 run_probe=1 probe="3b 7b 13b 20b 24b 28b 30b" probe_batch=4 budget=420 stages=0,1,2,3
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --gpus) gpus="$2"; shift 2 ;;
    --models) models="$2"; shift 2 ;;
    --batch) batch="$2"; shift 2 ;;
    --seq) seq="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --warmup) warmup="$2"; shift 2 ;;
    --no-compile) compile=0; shift ;;
    --copy-engine) copy_engine=--copy-engine; shift ;;
    --no-torch) run_torch=0; shift ;;
    --no-probe) run_probe=0; shift ;;
    --probe) probe="$2"; shift 2 ;;
    --probe-batch) probe_batch="$2"; shift 2 ;;
    --budget) budget="$2"; shift 2 ;;
    --stages) stages="$2"; shift 2 ;;
    --comm-dtype) comm_dtype="$2"; shift 2
      [ "$comm_dtype" = bf16 ] || { echo "run_zero_bench.sh: --comm-dtype '$comm_dtype': only bf16 (f32 is the default)" >&2; exit 2; } ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "run_zero_bench.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
case "$build" in /*) ;; *) build="$PWD/$build" ;; esac
models=${models//,/ }

# Libraries the GPU image lacks may be unpacked under .carry/root (as scripts/gpu/check.sh).
[ -d "$root/.carry/root/usr/lib" ] && export LD_LIBRARY_PATH="$root/.carry/root/usr/lib:${LD_LIBRARY_PATH:-}"
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}  # NVLink multicast off on both sides (our backend's default)
export DEEPSPEED_TIMEOUT=${DEEPSPEED_TIMEOUT:-3}  # minutes: a stuck collective fails instead of eating the budget
LOGDIR=${LOGDIR:-$(mktemp -d "${TMPDIR:-/tmp}/zero_bench.XXXXXX")}
mkdir -p "$LOGDIR"
: > "$LOGDIR/results.tsv"
: > "$LOGDIR/states.txt"
: > "$LOGDIR/probe.tsv"

have=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
[ "${have:-0}" -ge "$gpus" ] || { echo "run_zero_bench.sh: needs $gpus GPU(s), found ${have:-0}" >&2; exit 1; }
dscpp="$build/dscpp"
[ -x "$dscpp" ] && [ -x "$build/bench/dp_bench" ] || {
  echo "run_zero_bench.sh: $dscpp or $build/bench/dp_bench missing (build with -DDSCPP_CUDA=ON: targets dscpp" \
       "dp_bench)" >&2
  exit 1
}
echo "== $gpus x $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); models: $models; B=$batch T=$seq;" \
     "logs: $LOGDIR" >&2

torchrun=(python3 -m torch.distributed.run --standalone --nproc_per_node "$gpus")
launch=("$dscpp" launch --hostfile "$LOGDIR/no-hostfile" --num_gpus "$gpus" --master_port 0 --)

# run NAME TIMEOUT CMD...: stdout to NAME.out, stderr to NAME.err; RESULT and STATES lines collected (without the
# launcher's "[rank r] " prefix). Returns the command's exit code.
run() {
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  echo "== $name: $*" >&2
  # --foreground: the job stays in the caller's process group, so a caller's timeout or Ctrl-C stops it too
  # (a nested timeout starts its own group, and a torchrun left behind would run beside the next measurement).
  timeout --foreground -k 10 "$limit" "$@" > "$LOGDIR/$name.out" 2> "$LOGDIR/$name.err"
  local rc=$?
  [ $rc -ne 0 ] && echo "   $name exited with $rc (see $LOGDIR/$name.err): $(grep -m1 -E 'dp_bench: rank|Error|error' \
    "$LOGDIR/$name.err" | cut -c1-300)" >&2
  sed -E 's/^\[rank [0-9]+\] //' "$LOGDIR/$name.out" | grep -E '^RESULT' >> "$LOGDIR/results.tsv"
  sed -E 's/^\[rank [0-9]+\] //' "$LOGDIR/$name.out" | grep -E '^STATES' >> "$LOGDIR/states.txt"
  echo "   $name: $((SECONDS - t0)) s" >&2
  return $rc
}

# 1. The stages and FSDP2 on each model, at the model's micro-batch ("name:B"; --batch otherwise).
names=""
flags=() ours_comm=()
[ "$compile" = 1 ] && flags=(--compile)
[ "$comm_dtype" = bf16 ] && flags+=(--reduce-dtype bf16) && ours_comm=(--comm-dtype bf16)
for entry in $models; do
  m=${entry%%:*} b=$batch
  [ "$m" != "$entry" ] && b=${entry#*:}
  names="$names $m"
  common=(--batch "$b" --seq "$seq" --steps "$steps" --warmup "$warmup")
  run "dscpp_zero_$m" 240 "${launch[@]}" "$build/bench/dp_bench" --model "$m" --zero-stage "$stages" "${common[@]}" \
    --overlap --bucket 6250000 --stage3-reuse-distance 0 ${ours_comm[@]+"${ours_comm[@]}"} $copy_engine
  [ "$run_torch" = 1 ] && run "torch_fsdp2_$m" 360 "${torchrun[@]}" "$here/fsdp_torch.py" --models "$m" "${common[@]}" \
    ${flags[@]+"${flags[@]}"}
done

# 2. The largest Llama at stage 3 (activation checkpointing). Shapes: name L C H Hkv F (vocab 32000, tied). Stage 3
# model states are 18 bytes per parameter / N GPUs (bf16 params, f32 grads, masters, Adam m and v); each rank
# initialises only its shard (dp_bench uses the engine's sharded init at stage 3).
shape() {
  case "$1" in
    1b) echo "16 2048 32 8 8192" ;;     # the llama-1b preset (1.0B)
    3b) echo "28 3072 24 8 8192" ;;     # Llama 3.2 3B's blocks (2.9B with this vocab)
    7b) echo "32 4096 32 32 11008" ;;   # Llama 2 7B's blocks (6.6B with this vocab)
    13b) echo "40 5120 40 40 13824" ;;  # Llama 2 13B's blocks (12.9B)
    20b) echo "48 6144 48 8 16384" ;;   # GQA, 18.9B
    24b) echo "60 6144 48 8 16384" ;;   # the 20b blocks, 60 deep (23.6B): 106 GB of model states per GPU on 4
    28b) echo "70 6144 48 8 16384" ;;   # 70 deep (27.5B): 124 GB of model states per GPU on 4
    29b) echo "74 6144 48 8 16384" ;;   # 74 deep (29.1B): 131 GB on 4, ~10 GiB under an H200 with 13B's overheads
    31b) echo "78 6144 48 8 16384" ;;   # 78 deep (30.6B): 138 GB on 4, at the edge
    30b) echo "60 6656 52 52 17920" ;;  # LLaMA 33B's blocks (32.3B): 145 GB of model states per GPU on 4
    *) return 1 ;;
  esac
}
largest="" stopped=""
if [ "$run_probe" = 1 ]; then
  for p in $probe; do
    s=$(shape "$p") || { echo "run_zero_bench.sh: unknown probe size '$p'" >&2; continue; }
    if [ "$SECONDS" -ge "$budget" ]; then
      stopped="time budget ($budget s) spent before $p"
      break
    fi
    read -r L C H KV F <<< "$s"
    before=$(wc -l < "$LOGDIR/results.tsv")
    run "probe_$p" 180 "${launch[@]}" "$build/bench/dp_bench" --model llama-1b --zero-stage 3 --checkpointing --overlap \
      --batch "$probe_batch" --seq "$seq" --steps 3 --warmup 1 --stage3-reuse-distance 0 \
      --n-layer "$L" --n-embd "$C" --n-head "$H" --n-kv-head "$KV" --n-ffn "$F"
    rc=$?
    row=$(tail -n +"$((before + 1))" "$LOGDIR/results.tsv" | head -1)
    if [ $rc -eq 0 ] && [ -n "$row" ] && ! grep -qE 'OOM|ERROR' <<< "$row"; then
      printf '%s\tok\t%s\n' "$p" "$row" >> "$LOGDIR/probe.tsv"
      largest=$p
    else
      why=$(grep -m1 -E 'dp_bench: rank' "$LOGDIR/probe_$p.err" | sed -E 's/^\[rank [0-9]+\] //' | cut -c1-200)
      [ $rc -eq 124 ] || [ $rc -eq 137 ] && why="timed out after 180 s"
      printf '%s\tfailed\t%s\n' "$p" "${why:-exit code $rc}" >> "$LOGDIR/probe.tsv"
      stopped="$p failed"
      break
    fi
  done
fi

# One table from the RESULT lines: impl model world B T tps_total tps_gpu ms peak stage mfu n_params.
python3 - "$LOGDIR/results.tsv" "$LOGDIR/states.txt" "$LOGDIR/probe.tsv" "$largest" "$stopped" $names <<'PY'
import sys
results, states, probe, largest, stopped, models = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6:]
rows = {}
for line in open(results):
    f = line.rstrip("\n").split("\t")
    if len(f) < 12:
        continue
    impl = f"ours zero-{f[10]}" if f[1] == "dscpp" else f[1]
    rows.setdefault((f[2], impl), f)  # first row wins (a failing rank may repeat it)
def num(s):
    try:
        return float(s)
    except ValueError:
        return None
world = next((r[3] for r in rows.values()), "?")
print(f"\nZeRO on {world} GPUs, T {next((r[5] for r in rows.values()), '?')}, bf16 + f32 masters, AdamW, clip 1.0; "
      "B = micro-batch per GPU")
hdr = ["model", "impl", "B", "tok/s/GPU", "MFU %", "peak GiB", "ms/step", "ours/FSDP2"]
w = [12, 22, 4, 10, 6, 9, 9, 10]
print(" ".join(h.rjust(x) for h, x in zip(hdr, w)))
for m in models:
    fsdp = next((r for (mm, impl), r in rows.items() if mm == m and impl.startswith("torch-fsdp2")), None)
    base = num(fsdp[7]) if fsdp else None
    impls = [f"ours zero-{s}" for s in range(4)] + sorted(i for (mm, i) in rows if mm == m and i.startswith("torch"))
    for impl in impls:
        r = rows.get((m, impl))
        if not r:
            continue
        tps = num(r[7])
        ratio = f"{tps / base:.3f}x" if tps and base and impl.startswith("ours") else "-"
        print(" ".join(c.rjust(x) for c, x in zip([m, impl, r[4], r[7], r[11], r[9], r[8], ratio], w)))
st = [l.rstrip("\n") for l in open(states)]
if st:
    print("\nmodel states per rank (rank 0's Engine::model_state_report):")
    seen = set()
    for l in st:
        if l not in seen:
            seen.add(l)
            print("  " + l.replace("STATES\t", "").replace("\t", " "))
pr = [l.rstrip("\n").split("\t") for l in open(probe)]
if pr:
    print("\nlargest Llama at ZeRO stage 3 with activation checkpointing (3 timed steps after 1 warm-up):")
    print(" ".join(h.rjust(x) for h, x in zip(["size", "shape", "params", "tok/s/GPU", "MFU %", "peak GiB", "status"],
                                             [5, 18, 14, 10, 6, 9, 8])))
    for p in pr:
        if p[1] == "ok":
            r = p[2:]
            print(" ".join(c.rjust(x) for c, x in zip([p[0], r[2], f"{int(r[12]) / 1e9:.2f}B", r[7], r[11], r[9], "ok"],
                                                     [5, 18, 14, 10, 6, 9, 8])))
        else:
            print(f"{p[0]:>5} failed: {p[2]}")
    print(f"largest that trained: {largest or 'none'}" + (f" (stopped: {stopped})" if stopped else ""))
PY
echo "(raw output and logs: $LOGDIR)" >&2
