#!/usr/bin/env bash
# On a GPU machine: NVMe offload of the optimizer (Note [NVMe optimizer states]) in one call. Stages (default: all):
#   build    a fresh sm_90a build (scripts/gpu/check.sh build), with liburing / libaio from .carry
#   tests    test_swap (both I/O backends; io_uring skips, saying why, where the image's seccomp refuses it),
#            test_offload_nvme (NVMe against no offload, bit for bit on the CPU; the NCCL cases on the GPU within the
#            equivalence bound), test_offload
#   aio      bench/run_aio_bench.sh: the raw O_DIRECT loop and our swapper on io_uring and libaio, same disk, same run
#   train    train_bench on Llama-1B, ZeRO stage 2, bf16, 8 x 1024 tokens: no offload, offload to CPU, to NVMe
# The swap files and the probe go under $NVME_DIR (default .nvme/ in the repository: its disk); Llama-1B puts
# ~15 GB there. Before the call: bash scripts/gpu/prepare-carry.sh; run with carry [".carry"].
set -uo pipefail
default_steps=(build tests aio train)
source "$(dirname "$0")/stages.sh"
nvme_dir=${NVME_DIR:-$PWD/.nvme}
mkdir -p "$nvme_dir"
if want tests; then
  for t in test_swap test_offload_nvme test_offload; do
    TMPDIR="$nvme_dir" timeout 300 ./build-gpu/tests/$t > "$OUT/$t.log" 2>&1
    echo "$t rc=$?: $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/$t.log" | tr '\n' ' ')"
    grep -E "Failure|differ|cannot run here|Skipped" -A1 "$OUT/$t.log" | head -12
  done
  el tests
fi
if want aio; then
  timeout 400 bash bench/run_aio_bench.sh --build build-gpu --dir "$nvme_dir/aio" --gib 4 -- --repeat 2 > "$OUT/aio_bench.txt" 2>&1
  echo "aio bench rc=$?"
  cat "$OUT/aio_bench.txt"
  el aio
fi
if want train; then
  tb="./build-gpu/bench/train_bench --models llama-1b --batch 8 --seq 1024 --steps 4 --warmup 1 --zero-stage 2"
  for v in none cpu nvme; do
    extra=""
    [ "$v" = nvme ] && extra="--nvme-path $nvme_dir --sub-group 100000000 ${NVME_TRAIN_ARGS:-}"
    timeout 300 $tb --offload "$v" $extra > "$OUT/train_$v.out" 2> "$OUT/train_$v.err"
    echo "train_bench --offload $v rc=$?"
    grep -E "^RESULT" "$OUT/train_$v.out"
    grep -E "offload_optimizer|warning|aio:|error" "$OUT/train_$v.err" | head -4
    grep -E "host optimizer" "$OUT/train_$v.err" | tail -2
  done
  el train
fi
rm -rf "$nvme_dir/aio"
