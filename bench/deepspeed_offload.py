#!/usr/bin/env python3
"""DeepSpeed itself on bench/run_offload_bench.sh's model: the peer of our optimizer-offload rows.

Llama-1B as bench/train_torch.py builds it (transformers' LlamaForCausalLM from a config, no downloads), ZeRO stage 2
on one GPU, bf16, AdamW (lr 3e-4, betas (0.9, 0.95), eps 1e-8, weight decay 0.1 on matrices), gradient clipping 1.0,
random tokens, T = 1024; each variant with and without zero_optimization.offload_optimizer (device cpu, pin_memory),
which steps on the CPU with DeepSpeed's DeepSpeedCPUAdam. The same settings as train_bench's offload rows.

Prints train_bench's RESULT columns, one line per variant:
  RESULT impl model B T tokens_per_s ms_per_step mfu_pct - peak_mem_gib
(B counts the sequences of a step: micro-batch x gradient accumulation). A variant that fails prints ERROR or OOM.
Needs deepspeed importable (scripts/gpu/deepspeed-env.sh on the GPU image) and one GPU.
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_torch import PEAK_BF16_FLOPS, PRESETS, build_model, train_flops_per_token  # noqa: E402


def ds_config(micro, gas, offload):
    zero = {"stage": 2, "overlap_comm": True, "contiguous_gradients": True}
    if offload:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    return {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": gas,
        "gradient_clipping": 1.0,
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8,
                                                  "weight_decay": 0.1}},
        "zero_optimization": zero,
        "steps_per_print": 10**9,
    }


def run(name, micro, gas, offload, checkpointing, args, torch, deepspeed):
    arch, L, C, H, Hkv, FF, V = PRESETS[name]
    T = args.seq
    dev = torch.device("cuda")
    model = build_model(torch, name, T, dev)
    if checkpointing:
        model.m.gradient_checkpointing_enable()
    n_params = sum(p.numel() for p in model.parameters())
    groups = [{"params": [p for p in model.parameters() if p.dim() >= 2], "weight_decay": 0.1},
              {"params": [p for p in model.parameters() if p.dim() < 2], "weight_decay": 0.0}]
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=groups,
                                           config=ds_config(micro, gas, offload))
    g = torch.Generator(device=dev).manual_seed(42)
    torch.cuda.reset_peak_memory_stats()
    times = []
    label = f"deepspeed {name} {micro}x{gas}{'c' if checkpointing else ''} {'offload' if offload else 'none'}"
    for s in range(args.warmup + args.steps):
        batches = [(torch.randint(0, V, (micro, T), device=dev, generator=g),
                    torch.randint(0, V, (micro, T), device=dev, generator=g)) for _ in range(gas)]
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for idx, tgt in batches:
            loss = engine(idx, tgt)
            engine.backward(loss)
            engine.step()
        loss_v = loss.item()
        torch.cuda.synchronize()
        dt = (time.perf_counter() - t0) * 1e3
        print(f"  {label} step {s}: {dt:.1f} ms, loss {loss_v:.4f}", file=sys.stderr, flush=True)
        if s >= args.warmup:
            times.append(dt)
    med = statistics.median(times)
    tps = micro * gas * T / (med / 1e3)
    mfu = 100 * tps * train_flops_per_token(n_params, L, C, T) / PEAK_BF16_FLOPS
    peak = torch.cuda.max_memory_allocated() / 2**30
    engine.destroy()
    return [f"{tps:.0f}", f"{med:.1f}", f"{mfu:.1f}", "-", f"{peak:.2f}"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="llama-1b", choices=sorted(PRESETS))
    ap.add_argument("--tokens", default="8:1", help="micro-batch:gas per shape, a 'c' after the micro-batch turns "
                    "activation checkpointing on (as run_offload_bench.sh)")
    ap.add_argument("--variants", default="none,offload", help="comma list of none, offload")
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    args = ap.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    for v in variants:
        if v not in ("none", "offload"):
            ap.error(f"unknown variant {v!r} (known: none, offload)")
    shapes = []
    for shape in args.tokens.split():
        mb, _, gas = shape.partition(":")
        ck = mb.endswith("c")
        try:
            shapes.append((int(mb.rstrip("c")), int(gas or 1), ck))
        except ValueError:
            ap.error(f"--tokens: {shape!r} is not MICRO[c]:GAS")

    for k, v in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
                 ("MASTER_PORT", "29517")):
        os.environ.setdefault(k, v)
    import torch

    if not torch.cuda.is_available():
        print("deepspeed_offload: no CUDA device; nothing to measure", file=sys.stderr)
        return 1
    try:
        import deepspeed
    except ImportError as e:
        print(f"deepspeed_offload: deepspeed is not importable ({e}); see scripts/gpu/deepspeed-env.sh",
              file=sys.stderr)
        return 1
    print(f"deepspeed_offload: DeepSpeed {deepspeed.__version__}, torch {torch.__version__}, "
          f"{torch.cuda.get_device_name(0)}, {torch.get_num_threads()} host threads", file=sys.stderr)
    rc = 0
    for micro, gas, ck in shapes:
        for v in variants:
            try:
                cols = run(args.model, micro, gas, v == "offload", ck, args, torch, deepspeed)
            except Exception as e:  # one failing variant must not hide the others
                print(f"deepspeed_offload: {micro}x{gas} {v}: {type(e).__name__}: {e}", file=sys.stderr)
                cols, rc = ["OOM" if "out of memory" in str(e).lower() else "ERROR"] * 5, 1
            impl = "deepspeed" if v == "none" else "deepspeed-offload"
            print("\t".join(["RESULT", impl, args.model, str(micro * gas), str(args.seq)] + cols), flush=True)
            torch.cuda.empty_cache()
    return rc


if __name__ == "__main__":
    sys.exit(main())
