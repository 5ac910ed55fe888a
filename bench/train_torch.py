#!/usr/bin/env python3
"""PyTorch twin of bench/train_bench.cpp: the same models and settings, eager and torch.compile.

GPT-2 124M (vocab padded to 50304) and GPT-2 350M are written directly in torch (pre-norm blocks, tanh GELU, tied
lm head, F.scaled_dot_product_attention causal); the Llama ~1B is transformers' LlamaForCausalLM built from a config
(no downloads; SDPA attention). Random tokens, micro-batch B, T=1024, bf16 autocast over f32 weights, fused AdamW
(lr 3e-4, betas (0.9, 0.95), eps 1e-8, weight decay 0.1 on matrices), gradient clipping 1.0.

Prints one tab-separated line per (model, mode), prefixed RESULT, with the columns of train_bench:
  RESULT impl model B T tokens_per_s ms_per_step mfu_pct mfu_vs_gemm_pct peak_mem_gib
An out-of-memory run prints OOM in the numeric columns and the next one starts.

--profile-step OUT.json: after the timed steps, one more step under torch.profiler (CUPTI) writes its GPU kernels,
in launch order, as a JSON list of {"name": kernel name, "us": device microseconds} (bench/kernel_table.py reads
it). With more than one (model, mode) the files are OUT-<model>-<mode>.json.
"""
import argparse
import gc
import json
import math
import os
import statistics
import sys
import time

PEAK_BF16_FLOPS = 989.4e12  # H100 SXM dense bf16

PRESETS = {  # name: (arch, layers, width, heads, kv heads, ffn, vocab)
    "gpt2": ("gpt2", 12, 768, 12, 12, 3072, 50304),
    "gpt2-medium": ("gpt2", 24, 1024, 16, 16, 4096, 50304),
    "llama-1b": ("llama", 16, 2048, 32, 8, 8192, 32000),
}


def build_gpt2(torch, nn, F, L, C, H, V, T):
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = nn.LayerNorm(C)
            self.c_attn = nn.Linear(C, 3 * C)
            self.c_proj = nn.Linear(C, C)
            self.ln_2 = nn.LayerNorm(C)
            self.c_fc = nn.Linear(C, 4 * C)
            self.mlp_proj = nn.Linear(4 * C, C)

        def forward(self, x):
            B, T_, _ = x.shape
            q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
            q, k, v = (t.view(B, T_, H, C // H).transpose(1, 2) for t in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.c_proj(y.transpose(1, 2).contiguous().view(B, T_, C))
            return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(V, C)
            self.wpe = nn.Embedding(T, C)
            self.h = nn.ModuleList(Block() for _ in range(L))
            self.ln_f = nn.LayerNorm(C)
            self.lm_head = nn.Linear(C, V, bias=False)
            self.lm_head.weight = self.wte.weight  # tied, as GPT-2
            std_resid = 0.02 / math.sqrt(2 * L)
            for name, p in self.named_parameters():
                if p.dim() == 2:
                    nn.init.normal_(p, 0.0, std_resid if name.endswith("c_proj.weight") or name.endswith(
                        "mlp_proj.weight") else 0.02)
                elif "ln" in name and name.endswith("weight"):
                    nn.init.ones_(p)
                else:
                    nn.init.zeros_(p)

        def forward(self, idx, targets):
            pos = torch.arange(idx.size(1), device=idx.device)
            x = self.wte(idx) + self.wpe(pos)
            for b in self.h:
                x = b(x)
            logits = self.lm_head(self.ln_f(x))
            return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.view(-1))

    return GPT()


def build_llama(torch, L, C, H, Hkv, FF, V, T):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=C, intermediate_size=FF, num_hidden_layers=L, num_attention_heads=H,
                      num_key_value_heads=Hkv, vocab_size=V, max_position_embeddings=T, rope_theta=500000.0,
                      rms_norm_eps=1e-5, tie_word_embeddings=True, attn_implementation="sdpa")
    model = LlamaForCausalLM(cfg)

    class Wrapped(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, idx, targets):
            logits = self.m(input_ids=idx, use_cache=False).logits
            return torch.nn.functional.cross_entropy(logits.view(-1, V).float(), targets.view(-1))

    return Wrapped(model)


def train_flops_per_token(n_params, L, C, T):
    return 6 * n_params + 6 * L * C * T  # llm.c's formula, as ModelConfig::train_flops_per_token


def kernel_events(torch, prof):
    """[{"name", "us"}] of the GPU kernels among a finished profiler's events, in start order. Memcpy and memset
    activities are left out, as Nsight Compute (our side) sees kernels only."""
    out = []
    for ev in prof.events():
        if getattr(ev, "device_type", None) != torch.autograd.DeviceType.CUDA:  # host-side events
            continue
        if ev.name.startswith(("Memcpy", "Memset")):
            continue
        tr = getattr(ev, "time_range", None)
        if tr is not None:
            us, start = tr.end - tr.start, tr.start
        else:  # the per-event device time under its name of the day (device_time; cuda_time before torch 2.4)
            us = next(getattr(ev, a) for a in ("device_time", "cuda_time") if hasattr(ev, a))
            start = 0
        out.append((start, {"name": ev.name, "us": float(us)}))
    out.sort(key=lambda e: e[0])
    return [k for _, k in out]


def profile_step(torch, step, idx, tgt, path):
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step(idx, tgt)
        torch.cuda.synchronize()
    kernels = kernel_events(torch, prof)
    with open(path, "w") as f:
        json.dump(kernels, f, indent=0)
    total = sum(k["us"] for k in kernels) / 1e3
    print(f"  profiled step: {len(kernels)} kernels, {total:.1f} ms of kernel time -> {path}", file=sys.stderr)


# ---- shared by this script, ddp_torch.py and fsdp_torch.py ----

def build_model(torch, name, T, dev):
    """The preset's model on dev, from seed 1234 (the same initial weights on every rank)."""
    import torch.nn as nn
    import torch.nn.functional as F

    arch, L, C, H, Hkv, FF, V = PRESETS[name]
    torch.manual_seed(1234)
    model = (build_gpt2(torch, nn, F, L, C, H, V, T) if arch == "gpt2" else build_llama(torch, L, C, H, Hkv, FF, V, T))
    return model.to(dev)


def make_adamw(torch, model):
    """Fused AdamW as our engine's: lr 3e-4, betas (0.9, 0.95), eps 1e-8, weight decay 0.1 on matrices only."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                             lr=3e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)


def train_step(torch, forward, model, opt, autocast=True):
    """One training step as our engine's: forward (bf16 autocast unless the model casts itself, as FSDP2's policy
    does), backward, clip the global norm to 1.0, AdamW step."""
    def step(idx, tgt):
        if autocast:
            with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
                loss = forward(idx, tgt)
        else:
            loss = forward(idx, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return step


def timed_steps(torch, step, V, B, T, dev, seed, warmup, steps, label, agree=None, log=True):
    """Runs warmup + steps training steps on random tokens and returns (the timed steps' ms, the last batch). Each
    step is timed between two device synchronisations; agree(ms) -> ms makes ranks agree on one time (the slowest)."""
    g = torch.Generator(device=dev).manual_seed(seed)
    times = []
    for s in range(warmup + steps):
        idx = torch.randint(0, V, (B, T), device=dev, generator=g)
        tgt = torch.randint(0, V, (B, T), device=dev, generator=g)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = step(idx, tgt)
        loss_v = loss.item()
        torch.cuda.synchronize()
        dt = (time.perf_counter() - t0) * 1e3
        if agree:
            dt = agree(dt)
        if log:
            print(f"  {label} step {s}: {dt:.1f} ms, loss {loss_v:.4f}", file=sys.stderr, flush=True)
        if s >= warmup:
            times.append(dt)
    return times, (idx, tgt)


def run_distributed(tool, impl, args, models, run, oom_cols):
    """ddp_torch.py / fsdp_torch.py after their arguments: one NCCL process group over torchrun's ranks, then
    run(name, args, torch, dist, rank, world, dev) -> RESULT columns per model, printed by rank 0. Returns the exit
    code (1 when no GPU or a model ran out of memory)."""
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # as our NCCL backend
    import torch
    import torch.distributed as dist

    if not torch.cuda.is_available():
        print(f"{tool}: no CUDA device; nothing to measure", file=sys.stderr)
        return 1
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank % torch.cuda.device_count())
    dev = torch.device("cuda", torch.cuda.current_device())
    dist.init_process_group("nccl", device_id=dev)
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        print(f"{tool}: {world} rank(s) on {torch.cuda.get_device_name(dev)}, torch {torch.__version__}, {impl}, "
              f"B={args.batch} T={args.seq}", file=sys.stderr)
    rc = 0
    for name in models:
        try:
            cols = run(name, args, torch, dist, rank, world, dev)
        except torch.cuda.OutOfMemoryError as e:
            # Every rank runs out alike (same model and batch); the others' collectives would hang otherwise.
            print(f"{tool}: rank {rank}: {name}: {e}", file=sys.stderr)
            cols, rc = oom_cols, 1
        if rank == 0:
            print("\t".join(["RESULT", impl, name, str(world), str(args.batch), str(args.seq)] + cols), flush=True)
        gc.collect()
        torch.cuda.empty_cache()
        if args.compile:
            torch._dynamo.reset()
    dist.barrier()
    dist.destroy_process_group()
    return rc


def slowest_rank(torch, dist, dev):
    """agree() for timed_steps: every rank takes the slowest rank's step time (a step lasts that long)."""
    buf = torch.zeros(1, dtype=torch.float64, device=dev)

    def agree(ms):
        buf.fill_(ms)
        dist.all_reduce(buf, op=dist.ReduceOp.MAX)
        return buf.item()

    return agree


def peak_gib_over_ranks(torch, dist, dev):
    peak = torch.tensor([torch.cuda.max_memory_allocated() / 2**30], dtype=torch.float64, device=dev)
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    return peak.item()


def run(name, mode, args, torch):
    arch, L, C, H, Hkv, FF, V = PRESETS[name]
    T, B = args.seq, args.batch
    dev = torch.device("cuda")
    model = build_model(torch, name, T, dev)
    n_params = sum(p.numel() for p in model.parameters())  # tied weights counted once
    opt = make_adamw(torch, model)
    step = train_step(torch, torch.compile(model) if mode == "compile" else model, model, opt)

    torch.cuda.reset_peak_memory_stats()
    times, (idx, tgt) = timed_steps(torch, step, V, B, T, dev, 42, args.warmup, args.steps, f"torch-{mode} {name}")
    med = statistics.median(times)
    tps = B * T / (med / 1e3)
    flops = tps * train_flops_per_token(n_params, L, C, T)
    peak = torch.cuda.max_memory_allocated() / 2**30
    gemm = f"{100 * flops / (args.gemm_tflops * 1e12):.1f}" if args.gemm_tflops > 0 else "-"
    if args.profile_step:
        try:  # a failure here leaves the timings above valid
            profile_step(torch, step, idx, tgt, args.profile_step)
        except Exception as e:
            print(f"train_torch: {name} {mode}: --profile-step failed: {type(e).__name__}: {e}", file=sys.stderr)
    return [f"{tps:.0f}", f"{med:.1f}", f"{100 * flops / PEAK_BF16_FLOPS:.1f}", gemm, f"{peak:.2f}"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="gpt2,gpt2-medium,llama-1b")
    ap.add_argument("--modes", default="eager,compile", help="comma list of eager, compile")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3, help="compile mode adds 2 more (compilation)")
    ap.add_argument("--gemm-tflops", type=float, default=0.0)
    ap.add_argument("--profile-step", metavar="OUT.json", default=None,
                    help="after the timed steps, profile one more and write its kernels (see above)")
    args = ap.parse_args()
    for m in args.models.split(","):
        if m not in PRESETS:
            ap.error(f"unknown model {m!r} (known: {', '.join(PRESETS)})")
    modes = [m for m in args.modes.split(",") if m]
    for m in modes:
        if m not in ("eager", "compile"):
            ap.error(f"unknown mode {m!r}")

    import torch

    if not torch.cuda.is_available():
        print("train_torch: no CUDA device; nothing to measure", file=sys.stderr)
        return 1
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    print(f"train_torch on {torch.cuda.get_device_name(0)}, torch {torch.__version__}", file=sys.stderr)
    for name in args.models.split(","):
        for mode in modes:
            run_args = argparse.Namespace(**vars(args))
            if args.profile_step and len(args.models.split(",")) * len(modes) > 1:
                root, ext = os.path.splitext(args.profile_step)
                run_args.profile_step = f"{root}-{name}-{mode}{ext or '.json'}"
            if mode == "compile":
                run_args.warmup = args.warmup + 2
            try:
                cols = run(name, mode, run_args, torch)
            except torch.cuda.OutOfMemoryError as e:
                print(f"train_torch: {name} {mode}: {e}", file=sys.stderr)
                cols = ["OOM"] * 5
            except Exception as e:  # keep going: one failing model must not hide the others
                print(f"train_torch: {name} {mode}: {type(e).__name__}: {e}", file=sys.stderr)
                cols = ["OOM" if "out of memory" in str(e).lower() else "ERROR"] * 5
            print("\t".join(["RESULT", f"torch-{mode}", name, str(args.batch), str(args.seq)] + cols), flush=True)
            gc.collect()
            torch.cuda.empty_cache()
            if mode == "compile":
                torch._dynamo.reset()
    return 0


if __name__ == "__main__":
    sys.exit(main())
