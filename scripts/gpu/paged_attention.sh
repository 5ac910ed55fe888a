#!/usr/bin/env bash
# On a GPU machine: the decode attention over the paged KV cache (Note [Paged decode on tensor cores]) checked and
# measured against a baseline tree, in one call (< 600 s). Stages (default: build ops bench):
#   build    a fresh sm_90a build (scripts/gpu/check.sh build)
#   base     start building a baseline tree's inference_bench beside this one (stages.sh: .carry/base.tar)
#   ops      the op harness on the paged KV-cache ops (attention with 16-bit and fp8 caches, prompt chunks beside
#            decode tokens, splits)
#   bench    attention_bench paged: one call's time and KV rate per batch and context, 16-bit and fp8 caches
#   ab       inference_bench on this tree and on the baseline, alternately, medians of 2: the Llama-3.1-8B and
#            3.2-1B shapes at batch 1 and 8 (prompt 32, 128 new tokens), the 8B at batch 4 after a 1,024-token
#            prompt (a server's decode), and the 8B offline (400 requests of 256 + 256 tokens) with bf16 weights
#            and a bf16 cache, and with fp8 weights and an fp8 cache
# Before the call: bash scripts/gpu/prepare-carry.sh (and git archive -o .carry/base.tar REV for base / ab);
# run with carry [".carry"].
set -uo pipefail
default_steps=(build ops bench)
base_targets=inference_bench
source "$(dirname "$0")/stages.sh"
models=$(mktemp -d)
for m in llama-3.1-8b llama-3.2-1b; do mkdir -p "$models/$m" && cp bench/models/$m.json "$models/$m/config.json"; done
if want ops; then
  # kv_cache_append alone is left out: its harness cases take over 200 s on the device's CPU (the engine appends
  # through rope_kv_cache_append).
  run_ops paged_attention_forward rope_kv_cache_append
  el ops
fi
if want bench; then
  timeout 200 ./build-gpu/bench/attention_bench paged > "$OUT/attention_paged.log" 2>&1
  echo "attention_bench paged rc=$?"; grep -vE "^$" "$OUT/attention_paged.log"
  el bench
fi
if want ab; then
  wait_base
  run() {  # tree tag args...
    local tree=$1 tag=$2; shift 2
    local bin=./build-gpu/bench/inference_bench
    [ "$tree" = base ] && bin=./build-base/tree/build-gpu/bench/inference_bench
    timeout 150 $bin "$@" 2> "$OUT/ab-$tag-$tree.err" | grep -E "^RESULT|^OFFLINE" | sed "s/^/$tree\t$tag\t/" >> "$OUT/ab.tsv"
  }
  for round in 1 2; do
    for tree in base ours; do
      for m in llama-3.1-8b llama-3.2-1b; do run $tree "$m-p32" --model "$models/$m" --prompt 32 --new 128 --batch 1,8; done
      run $tree 8b-p1024 --model "$models/llama-3.1-8b" --prompt 1024 --new 128 --batch 4
      run $tree 8b-offline-bf16 --model "$models/llama-3.1-8b" --offline 400 --prompt 256 --new 256
      run $tree 8b-offline-fp8 --model "$models/llama-3.1-8b" --offline 400 --prompt 256 --new 256 --weights fp8 \
        --kv-cache-dtype fp8
    done
  done
  python3 - "$OUT/ab.tsv" <<'PY'
import sys, statistics as st, collections
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.rstrip("\n").split("\t")  # tree tag RESULT impl model B prompt new tok/s ... | OFFLINE impl model n p new tok/s
    if f[2] == "RESULT":
        rows[(f[1], "B=" + f[5], f[0])].append(float(f[8]))
    else:
        rows[(f[1], "total", f[0])].append(float(f[8]))
print(f"{'run':<18} {'':<7} {'base tok/s':>11} {'ours tok/s':>11} {'ours/base':>9}")
for (tag, what, tree) in sorted(k for k in rows if k[2] == "ours"):
    o, b = st.median(rows[(tag, what, "ours")]), st.median(rows.get((tag, what, "base"), [float("nan")]))
    print(f"{tag:<18} {what:<7} {b:>11.1f} {o:>11.1f} {o / b:>9.3f}")
PY
  el ab
fi
