#!/usr/bin/env bash
# Installs what is missing, builds everything, and runs every test (GPU tests skip without a GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/install-test-deps.sh  # before the build's configure, which picks the test interpreter
bash scripts/build.sh
cd build
ctest --output-on-failure -j "$(nproc)" "$@"
