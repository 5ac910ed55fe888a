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
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_torch  # noqa: E402  (the same model code as the single-GPU benchmark)


def run(name, args, torch, dist, rank, world, dev):
    from torch.nn.parallel import DistributedDataParallel as DDP

    V = train_torch.PRESETS[name][-1]
    T, B = args.seq, args.batch
    model = train_torch.build_model(torch, name, T, dev)  # the same weights everywhere (DDP also broadcasts rank 0's)
    opt = train_torch.make_adamw(torch, model)
    ddp = DDP(model, device_ids=[dev.index], bucket_cap_mb=args.bucket_mb)
    step = train_torch.train_step(torch, torch.compile(ddp) if args.compile else ddp, model, opt)

    torch.cuda.reset_peak_memory_stats()
    warmup = args.warmup + (2 if args.compile else 0)
    times, _ = train_torch.timed_steps(torch, step, V, B, T, dev, 42 + rank, warmup, args.steps,
                                       f"torch-ddp {name} x{world}", train_torch.slowest_rank(torch, dist, dev),
                                       log=rank == 0)
    med = statistics.median(times)
    per_gpu = B * T / (med / 1e3)
    peak = train_torch.peak_gib_over_ranks(torch, dist, dev)
    return [f"{per_gpu * world:.0f}", f"{per_gpu:.0f}", f"{med:.2f}", f"{peak:.2f}"]


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
    impl = "torch-ddp-compile" if args.compile else "torch-ddp-eager"
    return train_torch.run_distributed(f"ddp_torch (buckets {args.bucket_mb} MB)", impl, args, models, run,
                                       ["OOM"] * 4)


if __name__ == "__main__":
    sys.exit(main())
