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
# base: a baseline tree (.carry/base.tar, made here by `git archive -o .carry/base.tar REV`) built beside this one
# into build-base/ in the background, for the scripts' `ab` stages; wait_base waits for it. $base_targets: what
# the caller needs built there.
if want base && [ -f .carry/base.tar ]; then
  rm -rf build-base && mkdir -p build-base/tree && tar -xf .carry/base.tar -C build-base/tree &&
    ln -s "$PWD/.carry" build-base/tree/.carry
  ( cd build-base/tree && nice cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DDSCPP_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES=90a -DICU_ROOT="$PWD/.carry/root/usr" -DCMAKE_PREFIX_PATH="$PWD/.carry/root/usr" \
      > ../cmake.log 2>&1 && nice ninja -C build-gpu ${base_targets:-inference_bench} > ../build.log 2>&1
    echo $? > ../rc ) &
fi
wait_base() {
  while [ ! -f build-base/rc ] && [ -d build-base ]; do sleep 2; done
  [ "$(cat build-base/rc 2>/dev/null)" = 0 ] || { echo "baseline build failed:"; tail -20 build-base/build.log; }
  el baseline built
}
# The op harness on each op named: one summary line each and its first failures; the logs go into one file,
# $OUT/test_ops.log (a call returns a limited number of files).
run_ops() {
  local op log=$(mktemp)
  for op in "$@"; do
    timeout 200 ./build-gpu/tests/test_ops --op "$op" > "$log" 2>&1
    echo "test_ops --op $op rc=$?: $(grep -E 'passed' "$log" | tail -1)"
    grep -E "FAIL" "$log" | head -5
    { echo "== test_ops --op $op"; cat "$log"; } >> "$OUT/test_ops.log"
  done
  rm -f "$log"
}
if want build; then
  OUT=$OUT bash scripts/gpu/check.sh build | grep -E "build:|FAIL|error" | head -20
  el built
fi
[ -d .carry/root/usr/lib ] && export LD_LIBRARY_PATH=$PWD/.carry/root/usr/lib:${LD_LIBRARY_PATH:-}
cudnn_lib=$(grep -E "^CUDNN_LIBRARY:" build-gpu/CMakeCache.txt 2>/dev/null | cut -d= -f2)
[ -f "$cudnn_lib" ] && export LD_LIBRARY_PATH=$(dirname "$cudnn_lib"):$LD_LIBRARY_PATH
