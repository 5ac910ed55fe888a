#!/usr/bin/env bash
# Configures and builds into ./build (CUDA sources too when nvcc is found; DSCPP_CUDA=OFF to skip them).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
extra=()
[ -n "${DSCPP_CUDA:-}" ] && extra+=("-DDSCPP_CUDA=${DSCPP_CUDA}")
[ -x /usr/local/cuda/bin/nvcc ] && ! command -v nvcc >/dev/null && export PATH=/usr/local/cuda/bin:$PATH
if command -v nvcc >/dev/null && [ "${DSCPP_CUDA:-ON}" != OFF ]; then
  bash scripts/fetch-cudnn-frontend.sh || echo "cuDNN frontend headers not fetched: attention will use our own kernels"
fi
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "${extra[@]}" >/dev/null
cmake --build build -j "$(nproc)" "$@"
