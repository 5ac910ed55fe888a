#!/usr/bin/env python3
"""torch.distributed twin of bench/allreduce_bench.cpp: NCCL all_reduce bandwidth as nccl-tests report it.

Run one process per GPU:  python3 -m torch.distributed.run --standalone --nproc_per_node N bench/allreduce_torch.py
  [--min-mib 1] [--max-mib 1024] [--factor 4] [--dtypes bf16,f32] [--warmup 5] [--iters 0]

For a buffer of S bytes taking t seconds: algbw = S / t, busbw = algbw * 2(n-1)/n, GB/s = 1e9 B/s. Timing as
allreduce_bench: after --warmup calls, `iters` all_reduce (sum) calls back to back between two device
synchronisations; time = elapsed / iters, the slowest rank's; --iters 0 picks 20..200 by size. A buffer of rank+1
must first sum to n(n+1)/2. NVLink multicast (NVLS) is off unless NCCL_NVLS_ENABLE is set, as in our backend.
Rank 0 prints one tab-separated line per (dtype, size):
  RESULT impl op dtype world bytes time_us algbw_GBps busbw_GBps
"""
import argparse
import os
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--min-mib", type=int, default=1)
    ap.add_argument("--max-mib", type=int, default=1024)
    ap.add_argument("--factor", type=int, default=4)
    ap.add_argument("--dtypes", default="bf16,f32")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=0, help="0: 20..200 by size")
    args = ap.parse_args()
    if args.min_mib < 1 or args.max_mib < args.min_mib or args.factor < 2:
        ap.error("need 1 <= --min-mib <= --max-mib and --factor >= 2")
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

    import torch
    import torch.distributed as dist

    dtypes = {"bf16": torch.bfloat16, "f32": torch.float32, "f16": torch.float16}
    for d in args.dtypes.split(","):
        if d not in dtypes:
            ap.error(f"unknown dtype {d!r} (bf16, f32, f16)")
    if not torch.cuda.is_available():
        print("allreduce_torch: no CUDA device", file=sys.stderr)
        return 1
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank % torch.cuda.device_count())
    dev = torch.device("cuda", torch.cuda.current_device())
    dist.init_process_group("nccl", device_id=dev)
    rank, n = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        v = torch.cuda.nccl.version()  # a tuple in recent releases, an int (2.18.1 = 21801) in older ones
        v = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        print(f"allreduce_torch: {n} ranks on {torch.cuda.get_device_name(dev)}, torch {torch.__version__}, NCCL {v}",
              file=sys.stderr)
    bus = 2.0 * (n - 1) / n
    for name in args.dtypes.split(","):
        dt = dtypes[name]
        esize = torch.tensor([], dtype=dt).element_size()
        buf = torch.empty((args.max_mib << 20) // esize, dtype=dt, device=dev)
        buf.fill_(rank + 1)
        dist.all_reduce(buf)
        want = n * (n + 1) // 2
        got = buf[[0, buf.numel() // 3, buf.numel() // 2, -1]].float().cpu().tolist()
        if any(g != want for g in got):
            print(f"allreduce_torch: rank {rank}: sum is {got}, expected {want}", file=sys.stderr)
            return 1
        mib = args.min_mib
        while mib <= args.max_mib:
            nbytes = mib << 20
            t = buf[: nbytes // esize]
            iters = args.iters if args.iters > 0 else min(max((4 << 30) // nbytes, 20), 200)
            for _ in range(args.warmup):
                dist.all_reduce(t)
            dist.barrier()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(iters):
                dist.all_reduce(t)
            torch.cuda.synchronize()
            us = (time.perf_counter() - t0) * 1e6 / iters
            slowest = torch.tensor([us], dtype=torch.float32, device=dev)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            us = slowest.item()
            algbw = nbytes / (us * 1e-6) / 1e9
            if rank == 0:
                print(f"RESULT\ttorch\tall_reduce\t{name}\t{n}\t{nbytes}\t{us:.1f}\t{algbw:.1f}\t{algbw * bus:.1f}",
                      flush=True)
            mib *= args.factor
        del buf
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
