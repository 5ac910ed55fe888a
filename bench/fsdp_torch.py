#!/usr/bin/env python3
"""PyTorch FSDP2 (ZeRO-3) twin of bench/dp_bench.cpp --zero-stage 3: bench/train_torch.py's models, sharded.

Run one process per GPU:  python3 -m torch.distributed.run --standalone --nproc_per_node N bench/fsdp_torch.py
  [--models gpt2-medium,llama-1b] [--batch 8] [--seq 1024] [--steps 10] [--warmup 3] [--compile]
  [--reduce-dtype fp32|bf16]

The recipe of /work/shared/reference/anchors-measured.md (4x H200 table): torch.distributed.fsdp.fully_shard on every
transformer block, then on the root (embeddings, final norm, tied head); MixedPrecisionPolicy(param_dtype=bf16,
reduce_dtype=f32) (f32 sharded parameters and optimizer states, bf16 compute, f32 gradient reduce-scatter;
--reduce-dtype bf16: bf16 reduce-scatter, FSDP2's default when only param_dtype is set, impl suffix -bf16reduce);
reshard after forward (the default; our --stage3-reuse-distance 0); --compile: torch.compile of every block before
sharding (torchtitan's order), 2 extra warm-up steps for compilation. Fused AdamW (lr 3e-4, betas (0.9, 0.95), eps
1e-8, weight decay 0.1 on matrices), gradient clipping 1.0, random tokens (each rank its own), micro-batch B per GPU,
T = --seq. The models are train_torch.py's (imported): GPT-2 (vocab padded to 50304, flash SDPA) and transformers'
LlamaForCausalLM (SDPA).
Step time: every rank synchronises around the step, a step takes the slowest rank's time, the median over --steps
after the warm-up. Rank 0 prints per model, with dp_bench's columns:
  RESULT impl model world B T tokens_per_s_total tokens_per_s_per_gpu ms_per_step peak_mem_gib zero_stage mfu_pct
         n_params
impl = torch-fsdp2 or torch-fsdp2-compile; zero_stage = fsdp2; peak_mem_gib = the largest
torch.cuda.max_memory_allocated() over ranks (from after sharding: the unsharded f32 model built on each GPU first
is not counted); MFU = tokens/s per GPU x (6 N + 6 L C T) / 989.4 TFLOP/s (train_torch.py's formula).
"""
import argparse
import gc
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_torch  # noqa: E402  (the same model code as the single-GPU and DDP benchmarks)


def blocks_of(model, arch):
    return model.h if arch == "gpt2" else model.m.model.layers


def run(name, args, torch, dist, rank, world, dev):
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    arch, L, C, H, Hkv, FF, V = train_torch.PRESETS[name]
    T, B = args.seq, args.batch
    model = train_torch.build_model(torch, name, T, dev)
    n_params = sum(p.numel() for p in model.parameters())  # tied weights counted once
    blocks = blocks_of(model, arch)
    if args.compile:
        for i in range(len(blocks)):
            blocks[i] = torch.compile(blocks[i])
    reduce = torch.bfloat16 if args.reduce_dtype == "bf16" else torch.float32
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=reduce)
    for b in blocks:
        fully_shard(b, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    opt = train_torch.make_adamw(torch, model)

    step = train_torch.train_step(torch, model, model, opt, autocast=False)  # bf16 through FSDP2's policy

    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    warmup = args.warmup + (2 if args.compile else 0)
    times, _ = train_torch.timed_steps(torch, step, V, B, T, dev, 42 + rank, warmup, args.steps,
                                       f"torch-fsdp2 {name} x{world}", train_torch.slowest_rank(torch, dist, dev),
                                       log=rank == 0)
    med = statistics.median(times)
    per_gpu = B * T / (med / 1e3)
    mfu = 100 * per_gpu * train_torch.train_flops_per_token(n_params, L, C, T) / train_torch.PEAK_BF16_FLOPS
    peak = train_torch.peak_gib_over_ranks(torch, dist, dev)
    return [f"{per_gpu * world:.0f}", f"{per_gpu:.0f}", f"{med:.2f}", f"{peak:.2f}", "fsdp2", f"{mfu:.1f}",
            str(n_params)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="gpt2-medium,llama-1b")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--compile", action="store_true", help="torch.compile every block before sharding")
    ap.add_argument("--reduce-dtype", choices=["fp32", "bf16"], default="fp32",
                    help="gradient reduce-scatter dtype (MixedPrecisionPolicy.reduce_dtype)")
    args = ap.parse_args()
    models = [m for m in args.models.replace(" ", ",").split(",") if m]
    for m in models:
        if m not in train_torch.PRESETS:
            ap.error(f"unknown model {m!r} (known: {', '.join(train_torch.PRESETS)})")
    impl = ("torch-fsdp2-compile" if args.compile else "torch-fsdp2") + ("-bf16reduce" if args.reduce_dtype == "bf16" else "")
    return train_torch.run_distributed("fsdp_torch", impl, args, models, run, ["OOM"] * 4 + ["fsdp2", "OOM", "-"])


if __name__ == "__main__":
    sys.exit(main())
