# Sourced by the staged GPU scripts (inference.sh, tp.sh) after they set default_steps=(...): $OUT, the stages asked
# for (want NAME), elapsed-time lines (el WHAT), the build stage, and the loader path for the carried libraries and
# cuDNN.
cd "$(dirname "${BASH_SOURCE[1]}")/../.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=("${default_steps[@]}")
want() { for s in "${steps[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }
t0=$(date +%s)
el() { echo "[+$(( $(date +%s) - t0 ))s] $*"; }
if want build; then
  OUT=$OUT bash scripts/gpu/check.sh build | grep -E "build:|FAIL|error" | head -20
  el built
fi
[ -d .carry/root/usr/lib ] && export LD_LIBRARY_PATH=$PWD/.carry/root/usr/lib:${LD_LIBRARY_PATH:-}
cudnn_lib=$(grep -E "^CUDNN_LIBRARY:" build-gpu/CMakeCache.txt 2>/dev/null | cut -d= -f2)
[ -f "$cudnn_lib" ] && export LD_LIBRARY_PATH=$(dirname "$cudnn_lib"):$LD_LIBRARY_PATH
