#!/usr/bin/env bash
# Installs the Debian packages DeepSpeed.cpp builds with, when missing (apt-get; sudo when not root).
set -euo pipefail
pkgs=(g++ cmake ninja-build pkg-config libopenblas-openmp-dev nlohmann-json3-dev libcli11-dev libgtest-dev zlib1g-dev libicu-dev libcpp-httplib-dev fortunes libgloo-dev python3-venv liburing-dev libaio-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "installing: ${missing[*]}"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
