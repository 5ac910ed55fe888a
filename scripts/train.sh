#!/usr/bin/env bash
# The main job: installs what is missing, builds, and trains a small GPT on the built-in corpus.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh --target dscpp
exec ./build/dscpp train "$@"
