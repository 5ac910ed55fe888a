#!/usr/bin/env bash
# Quantization accuracy on a model trained on real text (issue: perplexity of held-out text against bf16):
#   1. Debian's fortunes (the text of every cookie file; .carry/fortunes.txt on the GPU machine, which has no apt)
#      split by fortune into 95% training and 5% held-out text;
#   2. dscpp train --device cuda --model gpt2 (GPT-2 124M's shape, a BPE of --vocab-size trained on the data),
#      --steps with the validation loss every 100 steps, so the log shows it flattening;
#   3. dscpp perplexity of the held-out text for each weight format (-q none|int8|int4|fp8) and the fp8 KV cache;
#   4. the model exported as a bf16 folder, quantized to int4 by `dscpp quantize` with and without AWQ scaling.
# Prints one table: perplexity and its change against bf16.
#   bash bench/run_quant_accuracy.sh [--build build-gpu] [--out DIR] [--steps 600] [--text FILE] [--device cuda]
#                                    [--model gpt2] [--seq-len 512]
set -euo pipefail
build=build-gpu out=quant-accuracy steps=600 text="" device=cuda model=gpt2 seq=512
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --text) text="$2"; shift 2 ;;
    --device) device="$2"; shift 2 ;;
    --model) model="$2"; shift 2 ;;
    --seq-len) seq="$2"; shift 2 ;;
    -h|--help) sed -n 2,11p "$0"; exit 0 ;;
    *) echo "unknown flag $1" >&2; exit 2 ;;
  esac
done
dscpp="$build/cli/dscpp"
[ -x "$dscpp" ] || dscpp="$build/dscpp"
mkdir -p "$out"
if [ -z "$text" ]; then
  for f in .carry/fortunes.txt /usr/share/games/fortunes; do [ -e "$f" ] && text="$f" && break; done
fi
[ -n "$text" ] || { echo "no text: pass --text FILE (or install fortunes-min / carry .carry/fortunes.txt)" >&2; exit 2; }
if [ -d "$text" ]; then  # the fortunes folder: every cookie file, without the .dat indexes
  find "$text" -maxdepth 1 -type f ! -name "*.dat" ! -name "*.u8" | sort | xargs cat > "$out/all.txt"
else
  cp "$text" "$out/all.txt"
fi
# Every 20th fortune (they end with a line "%") is held out.
awk -v RS='\n%\n' -v tr="$out/train.txt" -v ho="$out/heldout.txt" \
  '{ f = (NR % 20 == 0) ? ho : tr; printf "%s\n%%\n", $0 > f }' "$out/all.txt"
echo "train $(wc -c < "$out/train.txt") bytes, held out $(wc -c < "$out/heldout.txt") bytes"
start=$(date +%s)
"$dscpp" train --device "$device" --model "$model" --data "$out/train.txt" --vocab-size 2048 --seq-len "$seq" \
  --steps "$steps" --eval-every 100 --out "$out/run" --overwrite --samples 0 > "$out/train.log" 2>&1
echo "trained $steps steps in $(( $(date +%s) - start )) s; validation loss:"
grep -iE "val" "$out/train.log" | tail -8
ppl() {
  "$dscpp" perplexity --checkpoint "$out/run/checkpoints" --device "$device" --text "$out/heldout.txt" --window "$seq" "$@" \
    2>> "$out/ppl.err" | grep -oE "perplexity[^0-9]*[0-9.]+" | grep -oE "[0-9.]+$" | tail -1
}
base=$(ppl -q none)
printf "%-22s %12s %10s\n" "weights / cache" "perplexity" "vs bf16"
printf "%-22s %12s %10s\n" "bf16" "$base" ""
for q in int8 int4 fp8; do
  p=$(ppl -q $q)
  printf "%-22s %12s %9.3f%%\n" "$q" "$p" "$(python3 -c "print(($p / $base - 1) * 100)")"
done
p=$(ppl -q none --kv-cache-dtype fp8)
printf "%-22s %12s %9.3f%%\n" "bf16, fp8 KV cache" "$p" "$(python3 -c "print(($p / $base - 1) * 100)")"
# AWQ scaling (Note [AWQ scaling]) against round-to-nearest int4, both written by `dscpp quantize` from the trained
# model exported as a bf16 Hugging Face folder, and that folder's own bf16 perplexity as their baseline.
"$dscpp" ckpt export "$out/run/checkpoints" --format safetensors -o "$out/hf" --dtype bf16 > /dev/null 2>&1
"$dscpp" quantize --hf "$out/hf" --out "$out/hf-int4" --weights int4 > /dev/null 2>&1
start=$(date +%s)
"$dscpp" quantize --hf "$out/hf" --out "$out/hf-awq" --weights int4 --awq-calibration "$out/train.txt" \
  --awq-tokens 4096 > "$out/awq.log" 2>&1
echo "AWQ calibration and search: $(( $(date +%s) - start )) s; $(grep -E "linears scaled" "$out/awq.log" | tail -1)"
ppl_hf() {
  "$dscpp" perplexity --hf "$1" --device "$device" --text "$out/heldout.txt" --window "$seq" 2>> "$out/ppl.err" |
    grep -oE "perplexity[^0-9]*[0-9.]+" | grep -oE "[0-9.]+$" | tail -1
}
hbase=$(ppl_hf "$out/hf")
printf "%-22s %12s %10s\n" "bf16 (exported folder)" "$hbase" ""
for v in int4 awq; do
  p=$(ppl_hf "$out/hf-$v")
  label="int4 g128 RTN folder" && [ $v = awq ] && label="int4 g128 AWQ folder"
  printf "%-22s %12s %9.3f%%\n" "$label" "$p" "$(python3 -c "print(($p / $hbase - 1) * 100)")"
done
