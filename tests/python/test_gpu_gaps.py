#!/usr/bin/env python3
"""scripts/gpu_gaps.py on two synthetic CUPTI traces (bench/cupti_trace.cpp's CSV) with hand-computed figures.
Standard library only:  python3 tests/python/test_gpu_gaps.py
"""
import io
import os
import sys
import tempfile
import unittest
from contextlib import redirect_stdout

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
import gpu_gaps  # noqa: E402

US = 1000  # ns


def csv_text(gemm_us, wait_us):
    """One marked step: a GEMM and a norm on compute stream 7, an all-reduce on stream 13 that the next kernel waits
    for (a hole of `wait_us`, launched before it opened), then a host-bound hole of 100 us before adam (launched
    after the hole opened, while a synchronisation ran). Times in us from 0; the range spans [0, 2000]. With
    gemm_us = 400 and wait_us = 60: gemm [10, 410], norm [410, 460], all-reduce [440, 520], scale [520, 550], adam
    [630, 820]."""
    rows = ["kind,start,end,correlation,stream,name",
            f"range_start,0,0,1,0,dscpp_step"]
    k_end = 10 + gemm_us
    api = [(1, 2, 10, "cudaLaunchKernel"), (3, 4, 11, "cudaLaunchKernel"), (5, 6, 12, "ncclAllReduce"),
           (7, 8, 13, "cudaLaunchKernel")]
    norm_end = k_end + 50
    ar_end = norm_end + wait_us
    sync_end = ar_end + 100
    api.append((ar_end, sync_end, 14, "cudaStreamSynchronize"))
    api.append((sync_end + 1, sync_end + 2, 15, "cudaLaunchKernel"))
    for s, e, c, n in api:
        rows.append(f"runtime,{s * US},{e * US},{c},0,{n}")
    rows += [f"kernel,{10 * US},{k_end * US},10,7,gemm",
             f"kernel,{k_end * US},{norm_end * US},11,7,norm",
             f"kernel,{norm_end * US - 20 * US},{ar_end * US},12,13,ncclAllReduce",
             f"kernel,{ar_end * US},{ar_end * US + 30 * US},13,7,scale",
             f"kernel,{sync_end * US + 10 * US},{sync_end * US + 200 * US},15,7,adam",
             f"range_end,{2000 * US},{2000 * US},1,0,"]
    return "\n".join(rows) + "\n"


class GpuGaps(unittest.TestCase):
    def run_gaps(self, this, base=None, ranks=False):
        with tempfile.TemporaryDirectory() as d:
            paths = []
            for i, text in enumerate([this] + ([base] if base else [])):
                p = os.path.join(d, f"t{i}.csv")
                with open(p, "w") as f:
                    f.write(text)
                paths.append(p)
            if ranks:
                argv = ["--ranks"] + paths
            else:
                argv = [paths[0], "--min-us", "15"] + (["--base", paths[1]] if base else [])
            out = io.StringIO()
            with redirect_stdout(out):
                gpu_gaps.main(argv)
            return out.getvalue()

    def test_holes_and_what_caused_them(self):
        out = self.run_gaps(csv_text(gemm_us=400, wait_us=60))
        # span [10, 820]; compute busy 400 + 50 + 30 + 190 = 670 us.
        self.assertIn("GPU span 0.81 ms", out)
        self.assertIn("compute stream 7 busy 0.67 ms", out)
        # holes on stream 7: [460, 520] waits for the all-reduce (launched before); [550, 630] is the host's.
        self.assertIn("of at least 15 us: 2, 0.14 ms, of which host-bound 1, 0.08 ms", out)
        self.assertIn("ncclAllReduce 60us", out)

    def test_kernel_times_against_a_base(self):
        out = self.run_gaps(csv_text(gemm_us=450, wait_us=60), base=csv_text(gemm_us=400, wait_us=60))
        self.assertIn("compute-stream kernel time against", out)
        self.assertIn("+0.05 ms", out)
        self.assertRegex(out, r"\| gemm \| 1/1 \| 0\.40 \| 0\.45 \| \+0\.05 \|")

    def test_ranks_side_by_side(self):
        out = self.run_gaps(csv_text(gemm_us=450, wait_us=10), base=csv_text(gemm_us=400, wait_us=60), ranks=True)
        # compute kernels: 450 + 50 + 30 + 190 = 720 us and 670 us; the all-reduce starts 20 us before the norm ends
        # and lasts wait + 20 us: 30 and 80 us (the faster rank waits longer in it).
        self.assertRegex(out, r"\| t0\.csv \| 0\.000 \| [0-9.]+ \| 0\.72 \| 0\.03 \|")
        self.assertRegex(out, r"\| t1\.csv \| 0\.000 \| [0-9.]+ \| 0\.67 \| 0\.08 \|")

    def test_without_a_range_it_takes_the_busiest_stretch_between_syncs(self):
        text = csv_text(gemm_us=400, wait_us=60).replace("range_start", "x_start").replace("range_end", "x_end")
        text = text.replace("cudaStreamSynchronize", "cudaDeviceSynchronize")
        out = self.run_gaps(text + "runtime,0,1,99,0,cudaDeviceSynchronize\n")
        self.assertIn("between two cudaDeviceSynchronize", out)


if __name__ == "__main__":
    unittest.main()
