#!/usr/bin/env bash
# Autotuning on GPUs: for each model and GPU count, `dscpp autotune` over one stated space twice, with the
# exhaustive grid (gridsearch, no early stopping) and with the model-based tuner (autotuning's defaults: early
# stopping after 5 trials without a better one), then one table: trials, out-of-memory trials, wall seconds, the
# best experiment and its tokens/s, and the model-based run's best and wall time as shares of the grid's.
# Usage: bash bench/run_autotune_bench.sh [--build DIR] [--models "llama-1b gpt2-medium"] [--gpus "1 2"]
#          [--batch 32] [--timeout 900] [--reserve 3]
#   --batch: sequences of 1024 tokens per GPU per optimizer step (the global batch is fixed: micro-batch x
#            accumulation); --timeout: seconds per trial; --reserve: GiB of each GPU the estimate may not use.
# The stated space (a ds_config with lists: docs/CONFIG.md, "autotuning"), bf16, AdamW, clipping 1.0:
#   1 GPU:  zero_optimization.stage [0, 1] x offload_optimizer.device [none, cpu] (stage 1 only: one rank partitions
#           nothing) x activation checkpointing [off, every block] x dscpp.fused_head [false, true]
#   2 GPUs: zero_optimization.stage [0, 1, 2, 3] x overlap_comm [true, false] x activation checkpointing [off, every
#           block] x dscpp.fused_head [false, true]
#   each point at the micro-batches the search picks under the memory estimate (num_tuning_micro_batch_sizes 3);
#   each trial times steps 4-8 (start_profile_step 3, end_profile_step 8).
# Logs and every trial's folder: $LOGDIR (default a new folder under /tmp).
set -u
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
build="$root/build"
[ -x "$root/build-gpu/dscpp" ] && build="$root/build-gpu"
models="llama-1b gpt2-medium" gpus="1 2" batch=32 timeout=900 reserve=3
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --models) models="$2"; shift 2 ;;
    --gpus) gpus="$2"; shift 2 ;;
    --batch) batch="$2"; shift 2 ;;
    --timeout) timeout="$2"; shift 2 ;;
    --reserve) reserve="$2"; shift 2 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "run_autotune_bench.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
case "$build" in /*) ;; *) build="$PWD/$build" ;; esac
dscpp="$build/dscpp"
[ -x "$dscpp" ] || { echo "dscpp not found at $dscpp (build with -DDSCPP_CUDA=ON)" >&2; exit 1; }
LOGDIR=${LOGDIR:-$(mktemp -d "${TMPDIR:-/tmp}/autotune_bench.XXXXXX")}
mkdir -p "$LOGDIR"
echo "== logs: $LOGDIR" >&2

# Made-up text (the GPU image has no corpus), tokenized once per vocabulary by a synthetic tokenizer of the model's.
python3 - "$LOGDIR/corpus.txt" <<'EOF'
import random, sys
random.seed(0)
words = ("the a ship sails over quiet water while old sailors sing of distant harbours and storms that never "
         "came home light falls on stone walls in morning bread is warm").split()
with open(sys.argv[1], "w") as f:
    for _ in range(60000):
        f.write(" ".join(random.choice(words) for _ in range(12)) + ".\n")
EOF
vocab_of() { case "$1" in llama-1b) echo 32000 ;; gpt2*) echo 50304 ;; *) echo 32000 ;; esac; }
layers_of() { case "$1" in llama-1b) echo 16 ;; gpt2-medium) echo 24 ;; gpt2) echo 12 ;; *) echo 16 ;; esac; }

# config MODEL GPUS TUNER -> the ds_config's path
config() {
  local m="$1" g="$2" tuner="$3" L; L=$(layers_of "$m")
  local zero='"stage": [0, 1], "offload_optimizer": {"device": ["none", "cpu"]}'
  [ "$g" -gt 1 ] && zero='"stage": [0, 1, 2, 3], "overlap_comm": [true, false], "offload_optimizer": {"device": "none"}'
  local early=5; [ "$tuner" = gridsearch ] && early=0
  local f="$LOGDIR/${m}_${g}gpu_${tuner}.json"
  cat > "$f" <<EOF
{"train_batch_size": $((batch * g)), "bf16": {"enabled": true}, "gradient_clipping": 1.0, "steps_per_print": 1,
 "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "weight_decay": 0.1}},
 "zero_optimization": {$zero, "stage3_prefetch_bucket_size": 5e7, "stage3_param_persistence_threshold": 1e5},
 "activation_checkpointing": {"number_checkpoints": [null, $L]},
 "dscpp": {"fused_head": [false, true], "attention": "auto"},
 "autotuning": {"enabled": true, "fast": false, "tuner_type": "$tuner", "tuner_early_stopping": $early,
                "start_profile_step": 3, "end_profile_step": 8,
                "tuner_num_trials": 1000, "num_tuning_micro_batch_sizes": 3,
                "results_dir": "$LOGDIR/${m}_${g}gpu_${tuner}", "exps_dir": "$LOGDIR/${m}_${g}gpu_${tuner}_exps"}}
EOF
  echo "$f"
}

printf 'model\tgpus\ttuner\ttrials\toom\twall_s\tbest\tbest_tokens_per_s\n' > "$LOGDIR/results.tsv"
for m in $models; do
  v=$(vocab_of "$m")
  data="$LOGDIR/data_$v"
  if [ ! -f "$data/tok/tokenizer.json" ]; then  # tokenize writes nowhere it reads
    python3 "$root/bench/synthetic_tokenizer.py" --vocab "$v" --out "$data/tok" >/dev/null &&
      "$dscpp" tokenize --tokenizer "$data/tok/tokenizer.json" -o "$data/shards" "$LOGDIR/corpus.txt" > "$data.log" 2>&1 ||
      { echo "tokenizing for $m failed: $data.log" >&2; exit 1; }
  fi
  for g in $gpus; do
    for tuner in gridsearch model_based; do
      cfg=$(config "$m" "$g" "$tuner")
      log="$LOGDIR/${m}_${g}gpu_${tuner}.log"
      echo "== $m on $g GPU(s), $tuner: $log" >&2
      "$dscpp" autotune --num_gpus "$g" --trial_timeout "$timeout" --memory_reserve_gib "$reserve" \
          train --device cuda --model "$m" --config "$cfg" --data "$data"/shards/*.bin --tokenizer "$data/tok/tokenizer.json" \
          --seq-len 1024 --out "$LOGDIR/out" > "$log" 2>&1 || echo "   exited with $? (see $log)" >&2
      trials=$(sed -n 's/^Trials: \([0-9]*\) run.*/\1/p' "$log")
      wall=$(sed -n 's/^Trials: .* in \([0-9.]*\) s$/\1/p' "$log")
      best=$(sed -n 's/^Best: \([^ ]*\) .*/\1/p' "$log")
      tps=$(sed -n 's/^Best: .*, \([0-9]*\) tokens\/s).*/\1/p' "$log")
      oom=$(grep -l '"outcome": "out of memory"' "$LOGDIR/${m}_${g}gpu_${tuner}"/*/result.json 2>/dev/null | wc -l)
      printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$m" "$g" "$tuner" "${trials:-?}" "$oom" "${wall:-?}" \
        "${best:--}" "${tps:-0}" >> "$LOGDIR/results.tsv"
    done
  done
done

# One table; the model-based row also as shares of the grid's best tokens/s and wall time (targets: >= 97%, <= 25%).
awk -F'\t' -v OFS='\t' 'NR == 1 { print $0, "vs_grid_best", "vs_grid_wall"; next }
  { key = $1 "/" $2
    if ($3 == "gridsearch") { gt[key] = $8; gw[key] = $6; print $0, "", ""; next }
    b = (gt[key] > 0) ? sprintf("%.1f%%", 100 * $8 / gt[key]) : "?"
    w = (gw[key] > 0) ? sprintf("%.1f%%", 100 * $6 / gw[key]) : "?"
    print $0, b, w }' "$LOGDIR/results.tsv" |
  if command -v column >/dev/null; then column -t -s "$(printf '\t')"; else cat; fi
echo "(hand-tuned rows to compare with: docs/PERF.md, Llama-1B B16 and GPT-2 350M B32; every trial's folder and report: $LOGDIR)"
