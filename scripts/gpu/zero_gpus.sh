#!/usr/bin/env bash
# On a machine of several GPUs (all of them, or GPUS=N), what the ZeRO issue measures; one part per call (< 600 s):
#   compare: a fresh sm_90a build; the NCCL/ZeRO GPU tests (those for more GPUs skip); stage 3 with copy-engine
#            reductions and gathers (dscpp.copy_engine.enabled) against FSDP2 + torch.compile, Llama-1B (B 16) and
#            GPT-2 350M (B 32), 20 timed steps each side; then Llama-1B stage 3 with NCCL kernels, 20 steps.
#   probe:   (4 H200s) the largest stage-3 Llama: the 28b and 29b shapes of bench/run_zero_bench.sh (dscpp estimate-memory
#            predicts 127.5 and 134.2 GiB per GPU), with NCCL_DEBUG=WARN, CUDA errors' call stacks and the kernel's
#            Xid lines, for the 27.5B failure of the eighth session (cudaErrorContextIsDestroyed, not out of memory).
# Before the call: bash scripts/gpu/prepare-carry.sh; run with carry [".carry"]:
#   bash scripts/gpu/zero_gpus.sh compare 2>&1 | tail -40      (then: probe; build-gpu stays while the machine is warm)
set -uo pipefail
cd "$(dirname "$0")/../.."
part=${1:-compare}
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
t0=$(date +%s)
el() { echo "[+$(( $(date +%s) - t0 ))s] $*"; }
[ -d .carry/root/usr/lib ] && export LD_LIBRARY_PATH=$PWD/.carry/root/usr/lib:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0 DEEPSPEED_TIMEOUT=${DEEPSPEED_TIMEOUT:-3}
if [ ! -x build-gpu/bench/dp_bench ] || [ "$part" = compare ]; then
  OUT=/tmp/zerog_build bash scripts/gpu/check.sh build | grep -E "build:|FAILED" | head -5
fi
cudnn_lib=$(grep -E "^CUDNN_LIBRARY:" build-gpu/CMakeCache.txt 2>/dev/null | cut -d= -f2)
[ -f "$cudnn_lib" ] && export LD_LIBRARY_PATH=$(dirname "$cudnn_lib"):$LD_LIBRARY_PATH
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | head -1
gpus=${GPUS:-$(nvidia-smi -L | wc -l)}
el built
launch=(./build-gpu/dscpp launch --hostfile /tmp/zerog_nohost --master_port 0 --num_gpus "$gpus" --)
case "$part" in
  compare)
    (cd build-gpu && timeout 240 ctest --output-on-failure -R "Nccl" > "$OUT/zero_nccl_tests.log" 2>&1)
    echo "NCCL/ZeRO tests rc=$?: $(grep -E 'tests passed' "$OUT/zero_nccl_tests.log")"
    el tests
    LOGDIR=/tmp/zerog_ce timeout 330 bash bench/run_zero_bench.sh --build build-gpu --gpus "$gpus" --copy-engine \
      --models "llama-1b:16 gpt2-medium:32" --stages 3 --steps 20 --warmup 3 --no-probe > "$OUT/zero_ce.txt" 2>&1
    echo "zero bench rc=$?"; grep -E "^\|" "$OUT/zero_ce.txt"
    el compared
    timeout 120 "${launch[@]}" ./build-gpu/bench/dp_bench --model llama-1b --batch 16 --seq 1024 --zero-stage 3 \
      --overlap --stage3-reuse-distance 0 --steps 20 --warmup 3 2>/dev/null | grep RESULT | tee "$OUT/zero3_kernels.txt"
    el done ;;
  probe)
    NCCL_DEBUG=WARN LOGDIR=/tmp/zerog_probe timeout 540 bash bench/run_zero_bench.sh --build build-gpu --gpus "$gpus" \
      --models "" --no-torch --probe "28b 29b" --budget 400 > "$OUT/probe.txt" 2>&1
    echo "probe rc=$?"; tail -12 "$OUT/probe.txt"
    cp /tmp/zerog_probe/probe_28b.err "$OUT/" 2>/dev/null
    grep -h "predicted peak" /tmp/zerog_probe/states.txt 2>/dev/null | sed -E 's/.*stage 3: .*; (predicted.*)/\1/'
    (dmesg 2>/dev/null | grep -i xid | tail -5) || true  # a driver-reported GPU fault, if the kernel log is readable
    el done ;;
  *) echo "zero_gpus.sh: unknown part '$part' (compare | probe)" >&2; exit 2 ;;
esac
