#!/usr/bin/env bash
# On a machine with 2 GPUs: what tensor-parallel inference checks, in one call (< 600 s). Stages (default: all):
#   build    a fresh sm_90a build (scripts/gpu/check.sh build)
#   tests    tp 2 logits and greedy tokens against tp 1 (NCCL, f32 and bf16, decode graphs; test_inference_tp), the
#            peer all-reduce bit for bit against the rounded sum and NCCL (test_peer_all_reduce), the vocabulary-shard
#            embedding op against its CPU reference (test_ops)
#   bench    batch-1 decode on the Llama-3.1-8B shape (dummy weights): tp 1 on one GPU, then tp 2 with the peer
#            all-reduce and tp 2 on NCCL alone, in the same call (TP_BENCH_ARGS adds flags to all three)
#   allreduce  NCCL on the compute stream against our peer all-reduce, 4 KiB - 1 MiB, bf16, in CUDA graphs and not
# Before the call: bash scripts/gpu/prepare-carry.sh; run with carry [".carry"].
set -uo pipefail
default_steps=(build tests bench allreduce)
source "$(dirname "$0")/stages.sh"
if want tests; then
  for t in test_inference_tp test_peer_all_reduce; do
    timeout 200 ./build-gpu/tests/$t > "$OUT/$t.log" 2>&1
    echo "$t rc=$?: $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/$t.log" | tr '\n' ' ')"
    grep -E "Failure|worst|differ|rank [0-9]:" "$OUT/$t.log" | head -8
  done
  run_ops embedding
  el tests
fi
if want bench; then
  dir=$(mktemp -d) && cp bench/models/llama-3.1-8b.json "$dir/config.json"
  bench="./build-gpu/bench/inference_bench --model $dir --batch 1 --prompt 32 --new 256 ${TP_BENCH_ARGS:-}"
  launch="./build-gpu/dscpp launch --nproc_per_node 2 --master_port 0 -H /nonexistent --"
  { timeout 150 $bench; timeout 200 $launch $bench --tensor-parallel-size 2;
    timeout 200 $launch $bench --tensor-parallel-size 2 --peer-all-reduce-max-bytes 0; } > "$OUT/tp_bench.txt" 2>&1
  echo "tp bench rc=$?"
  grep -E "^(RESULT|STARTUP)|\] (RESULT|STARTUP)|tensor parallelism|error" "$OUT/tp_bench.txt" | head -12
  el bench
fi
if want allreduce; then
  ar="./build-gpu/bench/allreduce_bench --peer --min-kib 4 --max-kib 1024 --factor 2 --dtypes bf16"
  { timeout 120 ./build-gpu/dscpp launch --nproc_per_node 2 --master_port 0 -H /nonexistent -- $ar --graph;
    timeout 120 ./build-gpu/dscpp launch --nproc_per_node 2 --master_port 0 -H /nonexistent -- $ar; } \
    > "$OUT/allreduce_peer.txt" 2>&1
  echo "allreduce bench rc=$?"
  grep -E "RESULT|error" "$OUT/allreduce_peer.txt" | head -40
  el allreduce
fi
