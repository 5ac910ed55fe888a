#!/usr/bin/env bash
# On a machine with 2 GPUs: what 3D-parallel training checks, in one call (< 600 s). Stages (default: all):
#   build    a fresh sm_90a build (scripts/gpu/check.sh build)
#   ops      the tensor-parallel shard ops (embedding and cross-entropy shards, the shards' join) against their CPU
#            references (test_ops)
#   tp       the Llama-3.2-3B shape (bf16, AdamW, B 4, T 2048) on 2 GPUs: ZeRO-3 data parallelism, then tensor
#            parallelism 2 (ZeRO 0), with activation checkpointing and without, in the same call (bench/dp_bench.cpp)
#   sp       the same shape, with activation checkpointing: ZeRO-3, TP 2 and TP 2 with sequence parallelism
#            (Note [Sequence parallelism]), in the same call; then dscpp train --tp 2 with and without
#            dscpp.sequence_parallel (NCCL), their losses side by side
#   pp       the same shape with pipeline parallelism 2 (bench/pipe_bench.cpp: 1F1B and interleaved with 2 virtual
#            stages, 8 micro-batches of 2, each timed at 16 too for the measured bubble), against (p-1)/(vm+p-1);
#            the estimator's per-stage peaks
#   train    dscpp train --tp 2 on the built-in corpus (NCCL), saving at steps 30 and 60; the step-30 tag resumed on
#            one GPU (resharded as read) to step 60, its losses beside the uninterrupted tensor-parallel run's; then
#            dscpp train --pp 2 (the pipeline engine under the trainer) from the TP run's exported weights, with
#            the flops profiler, beside one GPU from the same weights
# Before the call: bash scripts/gpu/prepare-carry.sh; run with carry [".carry"].
set -uo pipefail
default_steps=(build ops tp sp pp train)
source "$(dirname "$0")/stages.sh"
launch="./build-gpu/dscpp launch --nproc_per_node 2 --master_port 0 -H /nonexistent --"
shape="--models llama-1b --n-layer 28 --n-embd 3072 --n-head 24 --n-kv-head 8 --n-ffn 8192 --n-vocab 128256"
if want ops; then
  run_ops embedding_shard crossentropy_shard crossentropy_combine
  el ops
fi
if want tp; then
  # With activation checkpointing (and tensor parallelism with partition_activations), then without unless
  # P3D_TP_NOCKPT=0; P3D_TP_ARGS adds flags to every run. The estimator's per-rank peaks of the same layouts follow.
  common="$shape --batch 4 --seq 2048 --steps 6 --warmup 2 --overlap ${P3D_TP_ARGS:-}"
  cks=(--checkpointing)
  [ "${P3D_TP_NOCKPT:-1}" = 1 ] && cks+=("")
  { for ck in "${cks[@]}"; do
      timeout 200 $launch ./build-gpu/bench/dp_bench $common $ck --zero-stage 3
      timeout 200 $launch ./build-gpu/bench/dp_bench $common $ck --zero-stage 0 --tp 2
    done
    timeout 200 $launch ./build-gpu/bench/dp_bench $common --checkpointing --zero-stage 0 --tp 2 \
      --partition-activations; } > "$OUT/tp_train.txt" 2>&1
  echo "tp train rc=$?"
  grep -E "RESULT|error|rank [0-9]:" "$OUT/tp_train.txt" | head -12
  grep -E "step [0-9]+:" "$OUT/tp_train.txt" | tail -4
  mkdir -p "$OUT/llama3b"
  echo '{"model_type": "llama", "hidden_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 24,
    "num_key_value_heads": 8, "intermediate_size": 8192, "vocab_size": 128256, "max_position_embeddings": 2048,
    "tie_word_embeddings": true, "rms_norm_eps": 1e-05, "rope_theta": 500000.0}' > "$OUT/llama3b/config.json"
  for part in false true; do
    echo "{\"train_micro_batch_size_per_gpu\": 4, \"bf16\": {\"enabled\": true}, \"zero_optimization\": {\"stage\": 0},
      \"activation_checkpointing\": {\"number_checkpoints\": 28, \"partition_activations\": $part},
      \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-4}}}" > "$OUT/llama3b/ds_$part.json"
    echo "estimate tp 2, checkpointing, partition_activations $part:"
    ./build-gpu/dscpp estimate-memory --config "$OUT/llama3b" --num_gpus_per_node 2 --tp 2 --seq_len 2048 \
      --deepspeed_config "$OUT/llama3b/ds_$part.json" | grep -E "^\| 0 \|" | tail -1
  done
  el tp
fi
if want sp; then
  # P3D_SP_RUNS: the layouts, '|'-separated dp_bench flags (default below); P3D_SP_NOCKPT=1 adds each without
  # activation checkpointing.
  common="$shape --batch 4 --seq 2048 --steps 6 --warmup 2 --overlap ${P3D_TP_ARGS:-}"
  runs=${P3D_SP_RUNS:-"--zero-stage 3|--zero-stage 0 --tp 2|--zero-stage 0 --tp 2 --sequence-parallel"}
  cks=(--checkpointing)
  [ "${P3D_SP_NOCKPT:-0}" = 1 ] && cks+=("")
  { for ck in "${cks[@]}"; do
      IFS='|' read -ra layouts <<< "$runs"
      for l in "${layouts[@]}"; do timeout 200 $launch ./build-gpu/bench/dp_bench $common $ck $l; done
    done; } > "$OUT/sp_train.txt" 2>&1
  echo "sp bench rc=$?"
  grep -E "RESULT|error|rank [0-9]:|killed" "$OUT/sp_train.txt" | head -16
  # The estimator's peak per rank for the checkpointed TP 2 runs above, without and with sequence parallelism.
  mkdir -p "$OUT/llama3b"
  [ -f "$OUT/llama3b/config.json" ] || echo '{"model_type": "llama", "hidden_size": 3072, "num_hidden_layers": 28,
    "num_attention_heads": 24, "num_key_value_heads": 8, "intermediate_size": 8192, "vocab_size": 128256,
    "max_position_embeddings": 2048, "tie_word_embeddings": true, "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0}' > "$OUT/llama3b/config.json"
  echo '{"train_micro_batch_size_per_gpu": 4, "bf16": {"enabled": true}, "zero_optimization": {"stage": 0},
    "activation_checkpointing": {"number_checkpoints": 28}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}}' \
    > "$OUT/llama3b/ds_sp.json"
  for flag in "" --sequence_parallel; do
    echo "estimate tp 2, checkpointing ${flag:-(no sequence parallelism)}:"
    ./build-gpu/dscpp estimate-memory --config "$OUT/llama3b" --num_gpus_per_node 2 --tp 2 --seq_len 2048 \
      --deepspeed_config "$OUT/llama3b/ds_sp.json" $flag | grep -E "^\| 0 \|" | tail -1
  done
  data="--data README.md docs/ARCHITECTURE.md docs/CONFIG.md docs/PERF.md"
  for sp in false true; do
    echo "{\"train_micro_batch_size_per_gpu\": 8, \"bf16\": {\"enabled\": true}, \"dscpp\": {\"sequence_parallel\": $sp},
      \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 6e-4}}}" > "$OUT/ds_sp_$sp.json"
    timeout 200 $launch ./build-gpu/dscpp train --device cuda --tp 2 --steps 60 --no-save --out "$OUT/sp_run_$sp" \
      --config "$OUT/ds_sp_$sp.json" $data > "$OUT/sp_dscpp_train_$sp.txt" 2>&1
    echo "dscpp train --tp 2, sequence_parallel $sp rc=$?"
    grep -E "step +(20|40|60)/|val loss|error" "$OUT/sp_dscpp_train_$sp.txt" | tail -4
  done
  rm -rf "$OUT"/sp_run_*
  el sp
fi
if want pp; then
  # Each pipe_bench run times m and 2m micro-batches: the measured bubble is 1 - m t / (T - S), t the time a
  # micro-batch adds, S the optimizer step's, beside (p-1)/(vm+p-1).
  pb="./build-gpu/pipe_bench --arch llama --n-layer 28 --n-embd 3072 --n-head 24 --n-kv-head 8 --n-ffn 8192"
  pb="$pb --n-vocab 128256 --seq 2048 --batch 2 --checkpointing --steps 4 --warmup 2 ${P3D_PP_ARGS:-}"
  { timeout 250 $launch $pb --pp 2 --micro-batches 8;
    timeout 250 $launch $pb --pp 2 --micro-batches 8 --virtual-stages 2; } > "$OUT/pp_train.txt" 2>&1
  echo "pp train rc=$?"
  grep -E "RESULT|error|rank [0-9]:" "$OUT/pp_train.txt" | head -12
  mkdir -p "$OUT/llama3b"
  [ -f "$OUT/llama3b/config.json" ] || echo '{"model_type": "llama", "hidden_size": 3072, "num_hidden_layers": 28,
    "num_attention_heads": 24, "num_key_value_heads": 8, "intermediate_size": 8192, "vocab_size": 128256,
    "max_position_embeddings": 2048, "tie_word_embeddings": true, "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0}' > "$OUT/llama3b/config.json"
  echo '{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 8, "bf16": {"enabled": true},
    "zero_optimization": {"stage": 0}, "activation_checkpointing": {"number_checkpoints": 28},
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}}' > "$OUT/llama3b/ds_pp.json"
  echo "estimate pp 2, m 8:"
  ./build-gpu/dscpp estimate-memory --config "$OUT/llama3b" --num_gpus_per_node 2 --pp 2 --seq_len 2048 \
    --deepspeed_config "$OUT/llama3b/ds_pp.json" | grep -E "^\| [01] \||bubble" | tail -4
  el pp
fi
if want train; then
  data="--data README.md docs/ARCHITECTURE.md docs/CONFIG.md docs/PERF.md"
  timeout 200 $launch ./build-gpu/dscpp train --device cuda --tp 2 --steps 60 --save-every 30 --out "$OUT/tp_run" \
    $data > "$OUT/tp_dscpp_train.txt" 2>&1
  echo "dscpp train --tp 2 rc=$?"
  grep -E "step +[0-9]+/|val loss|trained|checkpoint|error" "$OUT/tp_dscpp_train.txt" | tail -4
  cp -r "$OUT/tp_run" "$OUT/one_run" && echo global_step30 > "$OUT/one_run/checkpoints/latest"
  timeout 200 ./build-gpu/dscpp train --device cuda --resume --steps 60 --out "$OUT/one_run" $data \
    > "$OUT/one_dscpp_train.txt" 2>&1
  echo "dscpp train --resume (1 GPU, from the --tp 2 step-30 tag) rc=$?"
  grep -E "resumed|step +(40|50|60)/|error" "$OUT/one_dscpp_train.txt" | tail -4
  echo "the same steps of the uninterrupted --tp 2 run:"
  grep -E "step +(40|50|60)/" "$OUT/tp_dscpp_train.txt" | tail -3
  # The pipeline run starts from the TP run's weights (exported to a Hugging Face folder), each stage reading its
  # own tensors, with the flops profiler at step 5; its first validation loss beside one GPU's from the same folder.
  ./build-gpu/dscpp ckpt export "$OUT/tp_run/checkpoints" -o "$OUT/tp_hf" > "$OUT/export.txt" 2>&1
  echo "ckpt export rc=$?"
  echo '{"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 4, "bf16": {"enabled": true},
    "flops_profiler": {"enabled": true, "profile_step": 5}, "optimizer": {"type": "AdamW", "params": {"lr": 6e-4}}}' \
    > "$OUT/ds_pp.json"
  timeout 200 $launch ./build-gpu/dscpp train --device cuda --pp 2 --no-save --steps 20 --out "$OUT/pp_run" \
    --config "$OUT/ds_pp.json" --init-from "$OUT/tp_hf" $data > "$OUT/pp_dscpp_train.txt" 2>&1
  echo "dscpp train --pp 2 --init-from (the TP run's step-60 weights) rc=$?"
  grep -E "pipeline|predicted|FLOPS per|MFU|step +(10|20)/|val loss|error" "$OUT/pp_dscpp_train.txt" | head -12
  timeout 200 ./build-gpu/dscpp train --device cuda --no-save --steps 20 --out "$OUT/one_init" \
    --config "$OUT/ds_pp.json" --init-from "$OUT/tp_hf" $data > "$OUT/one_init_train.txt" 2>&1
  echo "dscpp train (1 GPU) --init-from the same folder rc=$?"
  grep -E "step +(10|20)/|val loss|error" "$OUT/one_init_train.txt" | head -4
  rm -rf "$OUT/tp_run" "$OUT/one_run" "$OUT/pp_run" "$OUT/one_init" "$OUT/tp_hf"
  el train
fi
