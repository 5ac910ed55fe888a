#!/usr/bin/env bash
# Unpacks the headers of cuDNN's header-only C++ frontend (PyPI: nvidia-cudnn-frontend) into .deps/cudnn-frontend,
# where CMake looks for them. Needed only for CUDA builds (cuDNN fused attention); skipped when already there.
set -euo pipefail
cd "$(dirname "$0")/.."
version=${CUDNN_FRONTEND_VERSION:-1.32.0}
dest=.deps/cudnn-frontend
[ -f "$dest/include/cudnn_frontend.h" ] && exit 0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if python3 -m pip --version >/dev/null 2>&1; then
  python3 -m pip download -q --no-deps --only-binary=:all: -d "$tmp" "nvidia-cudnn-frontend==$version" || true
fi
whl=$(ls "$tmp"/*.whl 2>/dev/null | head -1 || true)
if [ -z "$whl" ]; then  # no pip: ask PyPI's JSON API for a wheel's address
  url=$(curl -fsSL "https://pypi.org/pypi/nvidia-cudnn-frontend/$version/json" | python3 -c '
import json, sys
for f in json.load(sys.stdin)["urls"]:
    if f["filename"].endswith(".whl") and "x86_64" in f["filename"]:
        print(f["url"]); break')
  curl -fsSL -o "$tmp/frontend.whl" "$url"
  whl=$tmp/frontend.whl
fi
mkdir -p "$dest"
python3 - "$whl" "$dest" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    names = [n for n in z.namelist() if n.startswith("include/")]
    if not any(n.endswith("cudnn_frontend.h") for n in names):
        sys.exit("no include/cudnn_frontend.h in " + sys.argv[1])
    z.extractall(sys.argv[2], names)
PY
echo "cudnn_frontend $version headers in $dest/include"
