#!/usr/bin/env bash
# NVMe swap I/O against the disk's raw sequential bandwidth, in one run on one folder: aio_bench (the raw O_DIRECT
# loop, then our swapper on io_uring and libaio at several aio settings), then fio's sequential O_DIRECT write and
# read at 1 MiB x iodepth 32 when fio is installed (skipped, saying so, where it is not: the lent GPU image has none).
# Usage: bash bench/run_aio_bench.sh [--build DIR] [--dir DIR] [--gib 4] [-- extra aio_bench arguments]
#   --dir: the folder to measure (default: .aio_bench/ in the repository, i.e. its disk; removed afterwards).
# Needs liburing / libaio at run time: on a GPU image without them, scripts/gpu/prepare-carry.sh's .carry/root/usr/lib.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
build="$root/build"
[ -x "$root/build-gpu/aio_bench" ] && build="$root/build-gpu"
dir="$root/.aio_bench"
gib=4
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --dir) dir="$2"; shift 2 ;;
    --gib) gib="$2"; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,7p' "$0"; exit 0 ;;
    *) echo "run_aio_bench.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
[ -d "$root/.carry/root/usr/lib" ] && export LD_LIBRARY_PATH="$root/.carry/root/usr/lib:${LD_LIBRARY_PATH:-}"
bin="$build/aio_bench"
[ -x "$bin" ] || { echo "run_aio_bench.sh: no aio_bench in $build (ninja -C $build aio_bench)" >&2; exit 1; }
made=0
[ -d "$dir" ] || { mkdir -p "$dir" && made=1; }
[ "$made" = 1 ] && trap 'rm -rf "$dir"' EXIT
disk=$(df -h "$dir" | tail -1 | awk '{print $1 " (" $2 ", " $4 " free)"}')
echo "== kernel $(uname -r); $disk; $(findmnt -no FSTYPE -T "$dir" 2>/dev/null)"
"$bin" --dir "$dir" --gib "$gib" "${extra[@]}"
status=$?

if ! command -v fio >/dev/null; then
  echo "fio: not installed here, skipped"
  exit $status
fi
# fio's bandwidth in GB/s from its JSON (bw_bytes: bytes per second).
fio_rate() {  # rw engine
  fio --name=seq --filename="$dir/fio.tensor.swp" --size="${gib}G" --rw="$1" --bs=1M --iodepth=32 --direct=1 \
      --ioengine="$2" --numjobs=1 --output-format=json 2>/dev/null |
    python3 -c '
import json, sys
job = json.load(sys.stdin)["jobs"][0]
print("%.2f" % (max(job["write"]["bw_bytes"], job["read"]["bw_bytes"]) / 1e9))' 2>/dev/null || echo "n/a"
}
for engine in libaio io_uring; do
  w=$(fio_rate write "$engine")
  r=$(fio_rate read "$engine")
  printf "%-46s %11s %11s\n" "fio $engine (1 MiB, iodepth 32)" "$w" "$r"
done
rm -f "$dir/fio.tensor.swp"
exit $status
