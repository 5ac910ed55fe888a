#!/usr/bin/env bash
# On a GPU machine: where a batch-1 decode step's GPU time goes, in one call (< 600 s). Stages (default: all):
#   build    a fresh sm_90a build (scripts/gpu/check.sh build)
#   ops      the op harness on the decode path's ops (matmul, quantized matmul, norm + matmul, rope + KV append,
#            paged attention)
#   gemm     gemm_bench decode: the Llama-3.1-8B shape's decode linears, CUDA-core and tensor-core GEMVs
#   e2e      inference_bench batch 1 and 8 on the Llama-3.1-8B shape (E2E_WEIGHTS, default dense int4)
#   profile  one 8B batch-1 run per weight type under the CUPTI tracer (bench/cupti_trace.cpp): GPU time per kernel
#            and per token (the tracer itself slows each kernel; compare shares, not absolute times)
#   ncu      Nsight Compute on one layer's int4 GEMVs (qkv, o, gate_up, down) in the 8B decode graph: DRAM
#            throughput, issue activity, occupancy and the warp stall reasons
#   base     start building a baseline tree beside this one (.carry/base.tar, made here by `git archive -o
#            .carry/base.tar REV`) into build-base/, in the background; `ab` waits for it (on a warm machine a
#            later call finds it built)
#   ab       e2e on this tree and on the baseline, alternately (base, ours, base, ours), on Llama-3.1-8B and
#            Llama-3.2-1B, AB_WEIGHTS (default: dense int8 int4), batch 1 and 8, prompt 32, 128 new tokens; then one
#            table of the medians
# Before the call: bash scripts/gpu/prepare-carry.sh; run with carry [".carry"].
set -uo pipefail
default_steps=(build ops gemm e2e profile ncu)
base_targets=inference_bench
source "$(dirname "$0")/stages.sh"
models=$(mktemp -d)
mkdir -p "$models/llama-3.1-8b" && cp bench/models/llama-3.1-8b.json "$models/llama-3.1-8b/config.json"
ib=(./build-gpu/bench/inference_bench --model "$models/llama-3.1-8b" --prompt 32 --new 128)
if want ab; then
  wait_base
  for model in llama-3.1-8b llama-3.2-1b; do
    mkdir -p "$models/$model" && cp bench/models/$model.json "$models/$model/config.json"
    for w in ${AB_WEIGHTS:-dense int8 int4}; do
      for round in 1 2; do
        for tree in base ours; do
          bin=./build-gpu/bench/inference_bench
          [ $tree = base ] && bin=./build-base/tree/build-gpu/bench/inference_bench
          timeout 100 $bin --model "$models/$model" --prompt 32 --new 128 --weights $w --batch 1,8 \
            2> "$OUT/ab-$model-$w-$tree-$round.err" | grep -E "^RESULT" | sed "s/^/$tree\t$w\t/" >> "$OUT/ab.tsv"
        done
      done
    done
  done
  python3 - "$OUT/ab.tsv" <<'PY'
import sys, statistics as st, collections
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.rstrip("\n").split("\t")  # tree weights RESULT impl model B prompt new tok/s ms/step forwards peak host
    rows[(f[4].split("/")[-1], f[1], int(f[5]), f[0])].append(float(f[8]))
print(f"{'model':<14} {'weights':<7} {'B':>3} {'base tok/s':>11} {'ours tok/s':>11} {'ours/base':>9}")
for (m, w, b, tree) in sorted(k for k in rows if k[3] == "ours"):
    o, base = st.median(rows[(m, w, b, "ours")]), st.median(rows.get((m, w, b, "base"), [float("nan")]))
    print(f"{m:<14} {w:<7} {b:>3} {base:>11.1f} {o:>11.1f} {o / base:>9.3f}")
PY
  el ab
fi
if want ops; then
  run_ops matmul_forward matmul_q_forward rope_forward rope_kv_cache_append paged_attention_forward
  el ops
fi
if want gemm; then
  timeout 200 ./build-gpu/bench/gemm_bench decode > "$OUT/gemm_decode.log" 2>&1
  echo "gemm_bench decode rc=$?"; grep -A20 "^decode linears" "$OUT/gemm_decode.log"
  el gemm
fi
if want e2e; then
  for w in ${E2E_WEIGHTS:-dense int4}; do
    timeout 120 "${ib[@]}" --weights $w --batch 1,8 > "$OUT/e2e-$w.out" 2> "$OUT/e2e-$w.err" ||
      echo "inference_bench $w rc=$?"
    grep -E "^RESULT" "$OUT/e2e-$w.out"
  done
  el e2e
fi
if want profile; then
  trace=$PWD/build-gpu/bench/libdscpp_cupti_trace.so
  for w in dense int4; do
    CUDA_INJECTION64_PATH=$trace DSCPP_CUPTI_OUT=$OUT/decode-$w.csv timeout 120 "${ib[@]}" --weights $w --batch 1 \
      --warmup 0 > "$OUT/profile-$w.out" 2>&1
    echo "== 8B batch 1 $w: GPU time per token (decode steps of the trace's last half)"
    python3 scripts/gpu/kernel_sum.py "$OUT/decode-$w.csv" --frac 0.5 --steps 64 --top 10
    rm -f "$OUT/decode-$w.csv"
  done
  el profile
fi
if want ncu; then
  ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  if [ -z "$ncu" ]; then echo "ncu: not found"; else
    # Skip prefill and a few hundred decode GEMVs; then one layer's four, twice.
    timeout 300 "$ncu" --kernel-name-base demangled --kernel-name regex:gemv_mma --launch-skip 2000 --launch-count 8 --cache-control none \
      --clock-control none --section SpeedOfLight --section Occupancy --section SchedulerStats \
      --section WarpStateStats --section MemoryWorkloadAnalysis \
      "${ib[@]}" --weights int4 --batch 1 --warmup 0 > "$OUT/ncu.txt" 2>&1
    echo "ncu rc=$?"
    grep -E "gemv_mma|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Issue Slots Busy|No Eligible|Active Warps Per Scheduler|Eligible Warps|Warp Cycles Per Issued|Registers Per|Block Limit" "$OUT/ncu.txt" | head -120
    grep -iE "stall|scoreboard" "$OUT/ncu.txt" | head -20
  fi
  el ncu
fi
