#!/usr/bin/env bash
# On a GPU machine: parameter offload, CPU checkpointing and the fp8 KV cache in one call (< 600 s). Stages
# (default: all):
#   build    a fresh sm_90a build (scripts/gpu/check.sh build)
#   tests    ctest: offload (optimizer, parameters, NVMe, swap), CPU checkpointing, fp8 conversions and KV cache;
#            test_ops on the paged KV-cache ops (the fp8 cache cases among them)
#   param    train_bench, Llama-1B, ZeRO-3, bf16, 8 x 1024 tokens: no offload, parameters to the CPU, parameters and
#            optimizer to the CPU; then the Llama-3.1-8B shape with both offloaded, activation checkpointing and
#            cpu_checkpointing (the host's 128 GiB bound the shape: 14 bytes a parameter stay there)
#   paramnvme  train_bench, Llama-1B as in `param`: parameters and optimizer on the CPU against parameters on NVMe
#            (offload_param.device "nvme" under .nvme/, a mapped swap file) with the optimizer on the CPU; then the
#            Llama-3.1-8B shape with its parameters on NVMe (host: the optimizer's 12 bytes a parameter)
#   kv       inference_bench on the Llama-3.1-8B shape, KV cache bf16 against fp8: batch 1 / 32 at a 32-token prompt
#            and batch 32 at a 2,048-token prompt
#   base     start building a baseline tree's train_bench beside this one (stages.sh: .carry/base.tar)
#   ab       the `paramnvme` Llama-1B NVMe run on this tree and on the baseline, alternately, two rounds each
# Before the call: bash scripts/gpu/prepare-carry.sh; run with carry [".carry"].
set -uo pipefail
default_steps=(build tests param kv)
base_targets=train_bench
source "$(dirname "$0")/stages.sh"
if want tests; then
  mkdir -p .nvme
  (cd build-gpu && TMPDIR=$PWD/../.nvme timeout 400 ctest --output-on-failure -j 4 \
    -R "Offload|ParamOffload|Swap|Aio|CpuCheckpoint|Fp8|fp8|CudaTensor|Tiers|EstimateMemory") > "$OUT/ctest_offload.log" 2>&1
  echo "offload / fp8 ctest rc=$?: $(grep -E 'tests passed' "$OUT/ctest_offload.log")"
  grep -E "\(Failed\)|\*\*\*Failed|Timeout" "$OUT/ctest_offload.log" | head -10
  run_ops kv_cache_append paged_attention_forward
  el tests
fi
if want param; then
  tb="./build-gpu/bench/train_bench --steps 3 --warmup 1 --zero-stage 3"
  for v in "" "--offload-param cpu" "--offload-param cpu --offload cpu"; do
    timeout 200 $tb --models llama-1b --batch 8 --seq 1024 $v > "$OUT/param.out" 2> "$OUT/param.err"
    echo "llama-1b z3 ${v:-no offload}: rc=$? $(grep -E '^RESULT' "$OUT/param.out")"
    grep -E "placed on" "$OUT/param.err" | head -1 | sed 's/.*placed on/  placed on/'
  done
  timeout 330 $tb --models bench/models/llama-3.1-8b.json --batch 2 --seq 1024 --offload-param cpu --offload cpu \
    --checkpointing --cpu-checkpointing > "$OUT/param8b.out" 2> "$OUT/param8b.err"
  echo "llama-3.1-8b z3 params+optimizer on the CPU, checkpointing: rc=$? $(grep -E '^RESULT' "$OUT/param8b.out")"
  grep -E "placed on|host optimizer|rror" "$OUT/param8b.err" | tail -3 | cut -c1-400
  free -g | head -2
  el param
fi
if want paramnvme; then
  mkdir -p .nvme
  tb="./build-gpu/bench/train_bench --steps 3 --warmup 1 --zero-stage 3"
  for v in "--offload-param cpu --offload cpu" "--offload-param nvme --nvme-path .nvme --offload cpu"; do
    timeout 200 $tb --models llama-1b --batch 8 --seq 1024 $v > "$OUT/pnv.out" 2> "$OUT/pnv.err"
    echo "llama-1b z3 $v: rc=$? $(grep -E '^RESULT' "$OUT/pnv.out")"
    grep -E "placed on" "$OUT/pnv.err" | head -1 | sed 's/.*offload_param/  offload_param/' | cut -c1-300
  done
  timeout ${PNV_8B_TIMEOUT:-300} $tb --models bench/models/llama-3.1-8b.json --batch 2 --seq 1024 --offload-param nvme \
    --nvme-path .nvme --offload cpu --checkpointing --cpu-checkpointing > "$OUT/pnv8b.out" 2> "$OUT/pnv8b.err"
  echo "llama-3.1-8b z3 params on NVMe, optimizer on the CPU: rc=$? $(grep -E '^RESULT' "$OUT/pnv8b.out")"
  grep -E "placed on|host optimizer|rror" "$OUT/pnv8b.err" | tail -3 | cut -c1-400
  free -g | head -2; df -h .nvme | tail -1
  el paramnvme
fi
if want ab; then
  wait_base
  mkdir -p .nvme
  for round in 1 2; do
    for tree in base ours; do
      bin=./build-gpu/bench/train_bench
      [ $tree = base ] && bin=./build-base/tree/build-gpu/bench/train_bench
      timeout 200 $bin --steps 3 --warmup 1 --zero-stage 3 --models llama-1b --batch 8 --seq 1024 \
        --offload-param nvme --nvme-path .nvme --offload cpu > "$OUT/ab-$tree-$round.out" 2> "$OUT/ab-$tree-$round.err"
      echo "$tree round $round: rc=$? $(grep -E '^RESULT' "$OUT/ab-$tree-$round.out" | cut -f2-6)"
      grep -E "step 3:" "$OUT/ab-$tree-$round.err" | head -1
    done
  done
  el ab
fi
if want kv; then
  m=$(mktemp -d)/llama-3.1-8b; mkdir -p "$m"; cp bench/models/llama-3.1-8b.json "$m/config.json"
  for kv in auto fp8; do
    timeout 150 ./build-gpu/bench/inference_bench --model "$m" --prompt 32 --new 128 --batch 1,32 --kv-cache-dtype $kv \
      > "$OUT/kv-$kv.out" 2> "$OUT/kv-$kv.err"
    echo "kv $kv rc=$?"; grep -E "^RESULT" "$OUT/kv-$kv.out"; grep -E "^KV cache" "$OUT/kv-$kv.err" | head -1
    timeout 150 ./build-gpu/bench/inference_bench --model "$m" --prompt 2048 --new 128 --batch 32 --kv-cache-dtype $kv \
      > "$OUT/kvlong-$kv.out" 2> "$OUT/kvlong-$kv.err"
    echo "kv $kv prompt 2048 rc=$?"; grep -E "^RESULT" "$OUT/kvlong-$kv.out"
  done
  el kv
fi
