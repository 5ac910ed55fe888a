#!/usr/bin/env python3
"""The peers of bench/cpu_adam_bench.cpp on the same host: torch.optim.AdamW on the CPU (foreach and fused),
DeepSpeed's DeepSpeedCPUAdam (AdamW mode) where deepspeed imports, and a STREAM-style triad (a = b + s * c) giving
the host's memory bandwidth, all on every core torch's intra-op pool has.

f32 parameters, gradients and states of --sizes elements, lr 1e-3, betas (0.9, 0.95), eps 1e-8, weight decay 0.1.
Prints the median step over --iters (after one warm-up) as ns/element, G elements/s and GB/s of state traffic
(28 bytes an element, as cpu_adam_bench counts: param, grad, exp_avg, exp_avg_sq read; param, exp_avg, exp_avg_sq
written), and the triad's GB/s (12 bytes an element, STREAM's count).
"""
import argparse
import statistics
import sys
import time


def median_s(fn, iters):
    fn()  # warm-up: first touch, lazy state allocation, JIT
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def row(name, n, sec, bytes_per_elem):
    print(f"{name:<28} {n:>12,} {1e9 * sec / n:>8.3f} {n / sec / 1e9:>10.2f} {bytes_per_elem * n / sec / 1e9:>8.1f}",
          flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="100000000", help="comma list of element counts")
    ap.add_argument("--iters", type=int, default=5)
    args = ap.parse_args()
    import torch

    try:
        from deepspeed.ops.adam import DeepSpeedCPUAdam
    except Exception as e:  # not installed, or its op does not build here
        DeepSpeedCPUAdam = None
        print(f"cpu_adam_peers: no DeepSpeedCPUAdam ({type(e).__name__}: {e})", file=sys.stderr)
    print(f"cpu_adam_peers: torch {torch.__version__}, {torch.get_num_threads()} threads", flush=True)
    print(f"{'kernel':<28} {'elements':>12} {'ns/elem':>8} {'G elem/s':>10} {'GB/s':>8}")
    hyper = dict(lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    for n in (int(s) for s in args.sizes.split(",") if s):
        a, b, c = torch.empty(n), torch.rand(n), torch.rand(n)
        row("triad a = b + 3c", n, median_s(lambda: torch.add(b, c, alpha=3.0, out=a), args.iters), 12)
        del a, b, c

        def adam(make):
            p = torch.nn.Parameter(torch.rand(n) - 0.5)
            p.grad = torch.rand(n) - 0.5
            opt = make([p])
            sec = median_s(opt.step, args.iters)
            if not torch.isfinite(p.detach()[:1000]).all():
                raise RuntimeError("the step produced non-finite parameters")
            return sec

        row("torch AdamW foreach", n, adam(lambda ps: torch.optim.AdamW(ps, foreach=True, **hyper)), 28)
        row("torch AdamW fused", n, adam(lambda ps: torch.optim.AdamW(ps, fused=True, **hyper)), 28)
        if DeepSpeedCPUAdam is not None:
            row("DeepSpeedCPUAdam (AdamW)", n, adam(lambda ps: DeepSpeedCPUAdam(ps, adamw_mode=True, **hyper)), 28)
    return 0


if __name__ == "__main__":
    sys.exit(main())
