#!/usr/bin/env bash
# On the development machine (Debian 12), before a call to a lent GPU machine: fills the git-ignored .carry/ with
# what the GPU image lacks for a build, so that `run` can carry it (carry: [".carry"]):
#   .carry/root/usr/{include,lib}   ICU (libicu-dev, libicu72 from Debian's archive: the tokenizer's Unicode classes);
#                                   cpp-httplib (libcpp-httplib-dev, libcpp-httplib0.11: `dscpp serve`'s HTTP) with
#                                   the OpenSSL headers its header includes and the brotli libraries it links;
#                                   liburing and libaio (liburing-dev, liburing2, libaio-dev, libaio1: NVMe offload's
#                                   swap I/O, src/swap/);
#   .carry/cudnn-frontend/include   cuDNN's header-only frontend (scripts/fetch-cudnn-frontend.sh);
#   .carry/fortunes.txt             Debian's fortunes (fortunes, fortunes-min), the real text of
#                                   bench/run_quant_accuracy.sh.
#   .carry/deepspeed                DeepSpeed's sdist and the wheels it imports that the image lacks (PyPI, for
#                                   CPython 3.12 on x86-64): the peer of the offload benches, put on PYTHONPATH
#                                   there by scripts/gpu/deepspeed-env.sh.
# scripts/gpu/check.sh and bench/run_zero_bench.sh put .carry/root/usr/lib on LD_LIBRARY_PATH. About 46 MB.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=.carry/root
if [ ! -f "$root/usr/lib/libicuuc.so" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  (cd "$tmp" && apt-get download libicu-dev libicu72 >/dev/null 2>&1) ||
    { echo "prepare-carry.sh: apt-get download libicu-dev libicu72 failed" >&2; exit 1; }
  mkdir -p "$root"
  for d in "$tmp"/*.deb; do dpkg-deb -x "$d" "$root"; done
  # CMake's FindICU and the loader look in usr/lib; keep the common library and its data only.
  mv "$root"/usr/lib/x86_64-linux-gnu/* "$root/usr/lib/" && rmdir "$root/usr/lib/x86_64-linux-gnu"
  rm -rf "$root"/usr/lib/libicu{i18n,io,test,tu}* "$root/usr/share" "$root"/usr/bin "$root"/usr/sbin
  find "$root" -name "*.a" -delete
fi
if [ ! -f "$root/usr/lib/libcpp-httplib.so" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  (cd "$tmp" && apt-get download libcpp-httplib-dev libcpp-httplib0.11 libssl-dev libbrotli1 >/dev/null 2>&1) ||
    { echo "prepare-carry.sh: apt-get download libcpp-httplib-dev libcpp-httplib0.11 libssl-dev libbrotli1 failed" >&2; exit 1; }
  mkdir -p "$root"
  for d in "$tmp"/*.deb; do dpkg-deb -x "$d" "$root"; done
  cp -a "$root"/usr/lib/x86_64-linux-gnu/* "$root/usr/lib/" && rm -rf "$root/usr/lib/x86_64-linux-gnu"
  # The image's own libssl / libcrypto serve at run time; keep the headers and the httplib and brotli libraries.
  rm -rf "$root"/usr/lib/libssl* "$root"/usr/lib/libcrypto* "$root"/usr/lib/pkgconfig "$root/usr/share" "$root/usr/bin"
  find "$root" -name "*.a" -delete
  rm -rf "$tmp"
fi
if [ ! -f "$root/usr/lib/liburing.so" ] || [ ! -f "$root/usr/lib/libaio.so" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  (cd "$tmp" && apt-get download liburing-dev liburing2 libaio-dev libaio1 >/dev/null 2>&1) ||
    { echo "prepare-carry.sh: apt-get download liburing-dev liburing2 libaio-dev libaio1 failed" >&2; exit 1; }
  mkdir -p "$root"
  for d in "$tmp"/*.deb; do dpkg-deb -x "$d" "$root"; done
  # Headers in usr/include, the shared libraries (and their relative symlinks) in usr/lib, where CMake's
  # find_path / find_library look under CMAKE_PREFIX_PATH (src/swap/CMakeLists.txt) and the loader finds them.
  cp -a "$root"/usr/lib/x86_64-linux-gnu/* "$root/usr/lib/" && rm -rf "$root/usr/lib/x86_64-linux-gnu"
  rm -rf "$root"/usr/lib/pkgconfig "$root/usr/share"
  find "$root" -name "*.a" -delete
  rm -rf "$tmp"
fi
if [ ! -s .carry/fortunes.txt ] && [ -d /usr/share/games/fortunes ]; then
  find /usr/share/games/fortunes -maxdepth 1 -type f ! -name "*.dat" ! -name "*.u8" | sort | xargs cat \
    > .carry/fortunes.txt
fi
if ! ls .carry/deepspeed/deepspeed-*.tar.gz > /dev/null 2>&1; then
  mkdir -p .carry/deepspeed
  pip download -q --no-deps --no-binary :all: deepspeed==0.19.8 -d .carry/deepspeed &&
    pip download -q --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
      --platform manylinux_2_17_x86_64 -d .carry/deepspeed pydantic hjson py-cpuinfo msgpack psutil einops ||
    { echo "prepare-carry.sh: pip download of DeepSpeed and its wheels failed" >&2; rm -rf .carry/deepspeed; exit 1; }
fi
bash scripts/fetch-cudnn-frontend.sh
[ -f .carry/cudnn-frontend/include/cudnn_frontend.h ] || cp -r .deps/cudnn-frontend .carry/
du -sh .carry
