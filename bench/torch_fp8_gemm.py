#!/usr/bin/env python3
"""The peer of `gemm_bench fp8`: PyTorch's bf16 matmul and rowwise-scaled fp8 GEMM (torch._scaled_mm, what torchao's
and vLLM's per-token fp8 call on Hopper) on Llama-3.1-8B's four layer linears at the same row counts, the fp8 time
including the per-row quantization of the activations as ours does (warm, median of 20 CUDA-event timings)."""
import torch


def time_us(f, iters=20, warmup=3):
    for _ in range(warmup):
        f()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        f()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3)
    ts.sort()
    return ts[len(ts) // 2]


def quantize_rows(x):
    amax = x.abs().amax(dim=1, keepdim=True).float().clamp(min=1e-12)
    scale = amax / 448.0
    return (x.float() / scale).to(torch.float8_e4m3fn), scale


def main():
    torch.manual_seed(0)
    lins = [("qkv", 4096, 6144), ("o", 4096, 4096), ("gate_up", 4096, 28672), ("down", 14336, 4096)]
    print(f"torch {torch.__version__}: prefill linears, bf16 vs _scaled_mm rowwise fp8 (us, TFLOP/s)")
    print(f"{'linear':<8} {'N':>6} | {'bf16 us':>9} {'TFLOP/s':>7} | {'fp8 us':>9} {'TFLOP/s':>7} | {'ratio':>5}")
    for name, C, OC in lins:
        w = torch.randn(OC, C, device="cuda", dtype=torch.bfloat16) * 0.02
        wq, ws = quantize_rows(w)
        for N in (16, 256, 2048, 8192):
            x = torch.randn(N, C, device="cuda", dtype=torch.bfloat16)
            tb = time_us(lambda: x @ w.t())

            def fp8():
                xq, xs = quantize_rows(x)
                return torch._scaled_mm(xq, wq.t(), scale_a=xs, scale_b=ws.t(), out_dtype=torch.bfloat16)

            try:
                tf = time_us(fp8)
            except RuntimeError as e:  # shapes _scaled_mm refuses
                print(f"{name:<8} {N:>6} | _scaled_mm refused: {str(e).splitlines()[0]}")
                continue
            flop = 2.0 * N * C * OC
            print(f"{name:<8} {N:>6} | {tb:>9.1f} {flop / tb * 1e-6:>7.1f} | {tf:>9.1f} {flop / tf * 1e-6:>7.1f} | "
                  f"{tb / tf:>5.2f}")


if __name__ == "__main__":
    main()
