#!/usr/bin/env python3
"""PyTorch twin of `bench/attention_bench.cpp time`: causal bf16 attention through
torch.nn.functional.scaled_dot_product_attention restricted to the flash backend, on the same shapes.

Timing follows bench_util.h's time_ms: CUDA events around each run, 3 warm-up runs, the median of 20. "fwd" is one
SDPA call; "fwd+bwd" is the call plus out.backward(dout) in one timed region (ours: its forward and backward timed
separately and added). q, k, v are separate contiguous [B, H, T, D] leaves, so only the attention kernels are timed
(no layout copies), and a short GPU spin (torch.cuda._sleep) queued before each run keeps Python's launch overhead
out of the timing; ours, timed the same way minus the spin, includes its C++ launch latency (microseconds). GQA shapes (Hkv < H) use enable_gqa=True; a PyTorch whose flash backend refuses it gets K/V
expanded to H heads before timing, and the row says so (same FLOPs, more K/V memory traffic).

FLOPs as attention_bench: causal forward = half of the dense 4*B*H*T^2*D; backward = 2.5x the forward.

Prints one tab-separated line per shape, prefixed RESULT:
  RESULT torch B T H Hkv D fwd_ms fwd_tflops fb_ms fb_tflops note
Usage: attention_torch.py [--shapes "B,T,H,Hkv,D;..."] [--dtype bf16|f16] [--warmup 3] [--iters 20]
"""
import argparse
import sys

# bench/attention_bench.cpp run_timing(): keep the two lists equal.
DEFAULT_SHAPES = [
    (8, 1024, 12, 12, 64), (16, 1024, 12, 12, 64), (32, 1024, 12, 12, 64),
    (8, 1024, 32, 8, 64), (16, 1024, 32, 8, 64), (32, 1024, 32, 8, 64),
    (8, 1024, 32, 8, 128), (16, 1024, 32, 8, 128), (32, 1024, 32, 8, 128),
]


def parse_shapes(text):
    shapes = []
    for part in text.split(";"):
        part = part.strip()
        if part:
            vals = tuple(int(v) for v in part.split(","))
            if len(vals) != 5:
                raise SystemExit(f"attention_torch.py: shape '{part}' is not B,T,H,Hkv,D")
            shapes.append(vals)
    return shapes


def time_ms(torch, f, warmup, iters):
    """bench_util.h's time_ms: sorted(ms)[n // 2] of single timed runs after warm-up."""
    for _ in range(warmup):
        f()
    sleep = getattr(torch.cuda, "_sleep", None)
    ms = []
    for _ in range(iters):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        if sleep is not None:
            sleep(2_000_000)  # ~1 ms of GPU spin: Python queues the run meanwhile, so no launch gap is timed
        a.record()
        f()
        b.record()
        b.synchronize()
        ms.append(a.elapsed_time(b))
    return sorted(ms)[len(ms) // 2]


def flash_only(torch):
    """A context manager that allows only the flash SDPA backend (newer and older PyTorch spellings)."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        return sdpa_kernel(SDPBackend.FLASH_ATTENTION)
    except ImportError:
        return torch.backends.cuda.sdp_kernel(enable_flash=True, enable_math=False, enable_mem_efficient=False)


def run_shape(torch, F, shape, dtype, warmup, iters):
    B, T, H, Hkv, D = shape
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(3)
    q = torch.randn(B, H, T, D, device=dev, dtype=dtype, generator=g)
    k = torch.randn(B, Hkv, T, D, device=dev, dtype=dtype, generator=g)
    v = torch.randn(B, Hkv, T, D, device=dev, dtype=dtype, generator=g)
    dout = torch.randn(B, H, T, D, device=dev, dtype=dtype, generator=g)
    note = ""
    kwargs = {}
    if Hkv != H:
        kwargs["enable_gqa"] = True
        try:
            with flash_only(torch):
                F.scaled_dot_product_attention(q, k, v, is_causal=True, **kwargs)
            torch.cuda.synchronize()
        except (RuntimeError, TypeError):
            # This PyTorch's flash backend takes no GQA: give it H K/V heads (the group's copies).
            kwargs = {}
            k = k.repeat_interleave(H // Hkv, dim=1).contiguous()
            v = v.repeat_interleave(H // Hkv, dim=1).contiguous()
            note = "kv-expanded"
    for t in (q, k, v):
        t.requires_grad_(True)

    def fwd():
        with torch.no_grad():
            F.scaled_dot_product_attention(q, k, v, is_causal=True, **kwargs)

    def fwd_bwd():
        q.grad = k.grad = v.grad = None
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, **kwargs)
        out.backward(dout)

    with flash_only(torch):
        f_ms = time_ms(torch, fwd, warmup, iters)
        fb_ms = time_ms(torch, fwd_bwd, warmup, iters)
    flops = 4.0 * B * H * T * T * D * 0.5
    return f_ms, flops / f_ms * 1e-9, fb_ms, 3.5 * flops / fb_ms * 1e-9, note


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="", help='"B,T,H,Hkv,D;..." (default: attention_bench\'s list)')
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f16"])
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()
    shapes = parse_shapes(args.shapes) if args.shapes else DEFAULT_SHAPES

    import torch
    import torch.nn.functional as F

    if not torch.cuda.is_available():
        print("attention_torch.py: no CUDA device", file=sys.stderr)
        return 1
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}, {args.dtype}, flash SDPA, causal",
          file=sys.stderr)
    rc = 0
    for shape in shapes:
        try:
            f_ms, f_tf, fb_ms, fb_tf, note = run_shape(torch, F, shape, dtype, args.warmup, args.iters)
            cols = [f"{f_ms:.3f}", f"{f_tf:.1f}", f"{fb_ms:.3f}", f"{fb_tf:.1f}", note or "-"]
        except RuntimeError as e:  # OOM or no flash kernel for this shape: report it, go on
            print(f"attention_torch.py: {shape}: {e}", file=sys.stderr)
            cols = ["ERROR"] * 4 + ["-"]
            rc = 2
            torch.cuda.empty_cache()
        print("\t".join(["RESULT", "torch"] + [str(v) for v in shape] + cols), flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
