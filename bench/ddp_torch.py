#!/usr/bin/env python3
"""PyTorch DDP twin of bench/dp_bench.cpp: data-parallel training of bench/train_torch.py's models.

Run one process per GPU:  python3 -m torch.distributed.run --standalone --nproc_per_node N bench/ddp_torch.py
  [--models gpt2,gpt2-medium] [--batch 32] [--seq 1024] [--steps 10] [--warmup 3] [--compile] [--bucket-mb 25]

The model code is train_torch.py's (imported): GPT-2 with the vocab padded to 50304, pre-norm blocks, tanh GELU,
tied lm head, F.scaled_dot_product_attention (flash); random tokens (each rank its own), micro-batch B per GPU,
fp32 parameters under bf16 autocast, fused AdamW (lr 3e-4, betas (0.9, 0.95), eps 1e-8, weight decay 0.1 on
matrices), gradient clipping 1.0; DistributedDataParallel with --bucket-mb buckets (25: DDP's default), gradients
all-reduced during backward. --compile: torch.compile of the DDP-wrapped model (DDP's optimizer splits the graph at
bucket boundaries); it adds 2 warm-up steps for compilation.
Step time: every rank synchronises around the step, a step takes the slowest rank's time, the median over --steps
after the warm-up. Rank 0 prints per model, with dp_bench's columns:
  RESULT impl model world B T tokens_per_s_total tokens_per_s_per_gpu ms_per_step peak_mem_gib
peak_mem_gib = the largest torch.cuda.max_memory_allocated() over ranks.
"""
import argparse
import gc
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_torch  # noqa: E402  (the same model code as the single-GPU benchmark)


def run(name, args, torch, dist, rank, world, dev):
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    arch, L, C, H, Hkv, FF, V = train_torch.PRESETS[name]
    T, B = args.seq, args.batch
    torch.manual_seed(1234)  # the same initial weights everywhere (DDP also broadcasts rank 0's)
    if arch == "gpt2":
        model = train_torch.build_gpt2(torch, nn, F, L, C, H, V, T)
    else:
        model = train_torch.build_llama(torch, L, C, H, Hkv, FF, V, T)
    model = model.to(dev)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=3e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
    ddp = DDP(model, device_ids=[dev.index], bucket_cap_mb=args.bucket_mb)
    step_model = torch.compile(ddp) if args.compile else ddp

    def step(idx, tgt):
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            loss = step_model(idx, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    torch.cuda.reset_peak_memory_stats()
    g = torch.Generator(device=dev).manual_seed(42 + rank)
    warmup = args.warmup + (2 if args.compile else 0)
    times = []
    slowest = torch.zeros(1, dtype=torch.float64, device=dev)
    for s in range(warmup + args.steps):
        idx = torch.randint(0, V, (B, T), device=dev, generator=g)
        tgt = torch.randint(0, V, (B, T), device=dev, generator=g)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = step(idx, tgt)
        torch.cuda.synchronize()
        slowest.fill_((time.perf_counter() - t0) * 1e3)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        dt = slowest.item()
        if rank == 0:
            print(f"  torch-ddp {name} x{world} step {s}: {dt:.1f} ms, loss {loss.item():.4f}", file=sys.stderr,
                  flush=True)
        if s >= warmup:
            times.append(dt)
    med = statistics.median(times)
    per_gpu = B * T / (med / 1e3)
    peak = torch.tensor([torch.cuda.max_memory_allocated() / 2**30], dtype=torch.float64, device=dev)
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    return [f"{per_gpu * world:.0f}", f"{per_gpu:.0f}", f"{med:.2f}", f"{peak.item():.2f}"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="gpt2,gpt2-medium")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--compile", action="store_true", help="torch.compile the DDP model")
    ap.add_argument("--bucket-mb", type=float, default=25.0, help="DDP bucket_cap_mb")
    args = ap.parse_args()
    models = [m for m in args.models.split(",") if m]
    for m in models:
        if m not in train_torch.PRESETS:
            ap.error(f"unknown model {m!r} (known: {', '.join(train_torch.PRESETS)})")
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # as our NCCL backend

    import torch
    import torch.distributed as dist

    if not torch.cuda.is_available():
        print("ddp_torch: no CUDA device; nothing to measure", file=sys.stderr)
        return 1
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank % torch.cuda.device_count())
    dev = torch.device("cuda", torch.cuda.current_device())
    dist.init_process_group("nccl", device_id=dev)
    rank, world = dist.get_rank(), dist.get_world_size()
    impl = "torch-ddp-compile" if args.compile else "torch-ddp-eager"
    if rank == 0:
        print(f"ddp_torch: {world} rank(s) on {torch.cuda.get_device_name(dev)}, torch {torch.__version__}, {impl}, "
              f"B={args.batch} T={args.seq}, buckets {args.bucket_mb} MB", file=sys.stderr)
    rc = 0
    for name in models:
        try:
            cols = run(name, args, torch, dist, rank, world, dev)
        except torch.cuda.OutOfMemoryError as e:
            # Every rank runs out alike (same model and batch); the others' collectives would hang otherwise.
            print(f"ddp_torch: rank {rank}: {name}: {e}", file=sys.stderr)
            cols, rc = ["OOM"] * 4, 1
        if rank == 0:
            print("\t".join(["RESULT", impl, name, str(world), str(args.batch), str(args.seq)] + cols), flush=True)
        gc.collect()
        torch.cuda.empty_cache()
        if args.compile:
            torch._dynamo.reset()
    dist.barrier()
    dist.destroy_process_group()
    return rc


if __name__ == "__main__":
    sys.exit(main())
