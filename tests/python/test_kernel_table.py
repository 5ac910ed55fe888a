#!/usr/bin/env python3
"""bench/kernel_table.py on synthetic ncu CSV (details and raw pages) and kernel JSON: parsing (units rows, quoted
names with commas, thousands separators, interleaved program output), categories, and the table arithmetic; and
bench/train_torch.py's kernel filter for --profile-step on stand-in profiler events (no torch needed).
Standard library only:  python3 tests/python/test_kernel_table.py
"""
import io
import json
import os
import sys
import tempfile
import unittest
from contextlib import redirect_stdout
from types import SimpleNamespace as NS

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import kernel_table as kt  # noqa: E402
import train_torch  # noqa: E402  (imports torch only in main())

GEMM = "void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_32x6_tn_align8, int, float>" \
       "(T1::Params)"
NORM = "void dscpp::cuda::norm_fwd_kernel<__nv_bfloat16, 4>(const T1 *, float, int)"

# Default (details) page: one row per kernel and metric; ncu messages and program output around it.
DETAILS = f'''==PROF== Connected to process 4242 (/build/bench/train_bench)
train_bench on NVIDIA H100 80GB HBM3: B=32 T=1024
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","4242","train_bench","127.0.0.1","{GEMM}","1","7","(128, 1, 1)","(96, 4, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","nsecond","1,234,500"
==PROF== Profiling "norm_fwd_kernel": 0%....50%....100% - 1 pass
"1","4242","train_bench","127.0.0.1","{NORM}","1","7","(256, 1, 1)","(1024, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","nsecond","20,000"
"2","4242","train_bench","127.0.0.1","{GEMM}","1","7","(128, 1, 1)","(96, 4, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","nsecond","765,500"
RESULT	dscpp-bf16	gpt2	32	1024	OOM
'''

# --page raw: one column per metric and a units row under the header.
RAW = f'''"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","gpu__time_duration.sum"
"","","","","","","","","","","","usecond"
"0","4242","train_bench","127.0.0.1","{GEMM}","1","7","(128, 1, 1)","(96, 4, 1)","0","9.0","1,234.5"
"1","4242","train_bench","127.0.0.1","triton_red_fused_native_layer_norm_0","1","7","(256, 1, 1)","(1024, 1, 1)","0","9.0","20"
"2","4242","train_bench","127.0.0.1","void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl>(int, T2, T3)","1","7","(128, 1, 1)","(4096, 1, 1)","0","9.0","n/a"
'''


class ParseTest(unittest.TestCase):
    def test_details_page_with_noise_and_thousands_separators(self):
        k = kt.parse_ncu_csv(DETAILS)
        self.assertEqual([n for n, _ in k], [GEMM, NORM, GEMM])  # quoted names with commas survive whole
        self.assertEqual([round(us, 6) for _, us in k], [1234.5, 20.0, 765.5])

    def test_raw_page_units_row(self):
        k = kt.parse_ncu_csv(RAW)
        self.assertEqual(len(k), 2, k)  # the "n/a" row is skipped, the units row is not a kernel
        self.assertEqual(k[0], (GEMM, 1234.5))  # usecond from the units row: no scaling
        self.assertEqual(k[1], ("triton_red_fused_native_layer_norm_0", 20.0))

    def test_raw_page_nanoseconds(self):
        k = kt.parse_ncu_csv(RAW.replace('"usecond"', '"nsecond"'))
        self.assertAlmostEqual(k[0][1], 1.2345)

    def test_details_duration_and_metric_counted_once(self):
        dup = DETAILS.replace('"Command line profiler metrics","gpu__time_duration.sum","nsecond","20,000"',
                              '"GPU Speed Of Light Throughput","Duration","usecond","19.9"\n'
                              '"1","4242","train_bench","127.0.0.1","' + NORM.replace('"', '""') + '","1","7",'
                              '"(256, 1, 1)","(1024, 1, 1)","0","9.0","Command line profiler metrics",'
                              '"gpu__time_duration.sum","nsecond","20,000"')
        k = kt.parse_ncu_csv(dup)
        self.assertEqual(len(k), 3, k)
        self.assertEqual(k[1], (NORM, 20.0))  # the explicit metric replaced the section's Duration

    def test_rejects_unknown_unit_and_missing_header(self):
        with self.assertRaisesRegex(ValueError, "unknown time unit"):
            kt.parse_ncu_csv(RAW.replace('"usecond"', '"cycle"'))
        with self.assertRaisesRegex(ValueError, "no ncu CSV header"):
            kt.parse_ncu_csv("==PROF== No kernels were profiled.\n")
        with self.assertRaisesRegex(ValueError, "no kernel"):
            kt.parse_ncu_csv(DETAILS.splitlines()[2] + "\n")

    def test_json_and_load_detects_format(self):
        data = [{"name": GEMM, "us": 100.0}, {"name": "triton_poi_fused_add_0", "us": 2.5}]
        with tempfile.TemporaryDirectory() as d:
            pj, pc = os.path.join(d, "torch.json"), os.path.join(d, "ours.csv")
            with open(pj, "w") as f:
                json.dump(data, f)
            with open(pc, "w") as f:
                f.write(RAW)
            self.assertEqual(kt.load(pj), [(GEMM, 100.0), ("triton_poi_fused_add_0", 2.5)])
            self.assertEqual(len(kt.load(pc)), 2)
        with self.assertRaises(ValueError):
            kt.parse_json('{"name": "x", "us": 1}')


class CategoryTest(unittest.TestCase):
    CASES = {
        GEMM: "GEMM",
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1": "GEMM",
        "nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT": "GEMM",
        "void splitKreduce_kernel<32, 16, int, float, __nv_bfloat16>(cublasSplitKParams<float>)": "GEMM",
        "triton_tem_fused_mm_0": "GEMM",
        "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4>>(Flash_fwd_params)": "attention",
        "fmha_cutlassB_bf16_aligned_64x64_k64_sm80": "attention",
        "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x64x64_4x1x1": "attention",
        "void dscpp::cuda::attn_bwd_dot_kernel<__nv_bfloat16>(int)": "attention",
        NORM: "norm",
        "triton_per_fused_native_layer_norm_backward_3": "norm",
        "triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_1": "norm",
        "void at::native::(anonymous namespace)::GammaBetaBackwardCUDAKernel<float, float>(long)": "norm",
        "triton_red_fused__log_softmax_nll_loss_forward_2": "cross-entropy",
        "void dscpp::cuda::ce_fwd_kernel<__nv_bfloat16>(int)": "cross-entropy",
        "void at::native::multi_tensor_apply_kernel<at::native::FusedAdamMathFunctor<float, 4>>(int)": "optimizer",
        "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::NormTwoOps<float>>>(int)":
            "optimizer",
        "void dscpp::cuda::adam_kernel<float>(int)": "optimizer",
        "triton_red_fused_sum_view_4": "reduction/comm",
        "void dscpp::cuda::dbias_partial_kernel<__nv_bfloat16>(int)": "reduction/comm",
        "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm *)": "reduction/comm",
        "triton_poi_fused_add_gelu_5": "elementwise+other",
        "void dscpp::cuda::normal_kernel<float>(int)": "elementwise+other",  # "normal" is not a norm
        "void dscpp::cuda::embedding_fwd_kernel<__nv_bfloat16>(int)": "elementwise+other",
    }

    def test_categories(self):
        for name, want in self.CASES.items():
            self.assertEqual(kt.category(name), want, name)


class TableTest(unittest.TestCase):
    def rows(self, text):
        """{first cell: [cells]} of the category table."""
        out = {}
        for line in text.splitlines():
            if line.startswith("| ") and not line.startswith("| #"):
                cells = [c.strip() for c in line.strip("|").split("|")]
                out.setdefault(cells[0], cells[1:])
        return out

    def run_main(self, argv):
        buf = io.StringIO()
        with redirect_stdout(buf):
            self.assertEqual(kt.main(argv), 0)
        return buf.getvalue()

    def test_side_by_side_with_step_time(self):
        torch = [{"name": GEMM, "us": 1500.0}, {"name": "triton_poi_fused_add_0", "us": 250.0},
                 {"name": "triton_poi_fused_add_0", "us": 250.0}]
        with tempfile.TemporaryDirectory() as d:
            pc, pj = os.path.join(d, "ours.csv"), os.path.join(d, "torch.json")
            with open(pc, "w") as f:
                f.write(DETAILS)
            with open(pj, "w") as f:
                json.dump(torch, f)
            text = self.run_main([pc, "--label", "dscpp", "--step-ms", "2.5", "--compare", pj,
                                  "--compare-label", "compile", "--top", "2", "--gemm-tflop", "1.0",
                                  "--gemm-peak", "678"])
        r = self.rows(text)
        self.assertIn("dscpp ms", text)
        self.assertIn("compile ms", text)
        # ours: GEMM 2 kernels 2.0 ms = 80% of a 2.5 ms step; norm 0.02 ms; gaps 2.5 - 2.02 = 0.48 ms
        self.assertEqual(r["GEMM"][:3], ["2", "2.00", "80.0"])
        self.assertEqual(r["norm"][:3], ["1", "0.02", "0.8"])
        # torch, no step time: % of the kernel sum (2.0 ms)
        self.assertEqual(r["GEMM"][3:], ["1", "1.50", "75.0"])
        self.assertEqual(r["elementwise+other"][3:], ["2", "0.50", "25.0"])
        self.assertEqual(r["**kernel sum**"], ["3", "2.02", "80.8", "3", "2.00", "100.0"])
        self.assertEqual(r["gaps (step - kernels)"][:3], ["", "0.48", "19.2"])
        self.assertEqual(r["gaps (step - kernels)"][3:], ["", "-", "-"])
        self.assertEqual(r["step wall time"][:3], ["", "2.50", "100.0"])
        # GEMM throughput: 1 TFLOP in 2.0 ms = 500 TFLOP/s = 74% of 678; torch 1.5 ms = 667 = 98%
        self.assertIn("dscpp 500 TFLOP/s = 74% of 678", text)
        self.assertIn("compile 667 TFLOP/s = 98% of 678", text)
        # top list: the two GEMM launches merged into one row, parameter list and "void " dropped
        self.assertIn("| 1 | `cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_32x6_tn_...`"
                      " | GEMM | 2 | 2.00 | 80.0 |", text)
        self.assertIn("| 2 | `triton_poi_fused_add_0` | elementwise+other | 2 | 0.50 | 25.0 |", text)

    def test_short_names(self):
        self.assertEqual(kt.short("void k<a, b>(int, float)"), "`k<a, b>`")
        self.assertEqual(kt.short("f(x)(y)"), "`f(x)`")
        self.assertEqual(kt.short("a|b"), "`a\\|b`")
        self.assertEqual(len(kt.short("x" * 200)), 82)

    def test_missing_file_is_an_error(self):
        with redirect_stdout(io.StringIO()):
            self.assertEqual(kt.main(["/nonexistent/ours.csv"]), 1)


class TorchKernelEventsTest(unittest.TestCase):
    """train_torch.kernel_events: device kernels only (no host ops, memcpy, memset), in start order, durations from
    time_range, or from device_time / cuda_time on events without one."""
    CUDA, CPU = "DeviceType.CUDA", "DeviceType.CPU"
    torch = NS(autograd=NS(DeviceType=NS(CUDA=CUDA, CPU=CPU)))

    def ev(self, name, dev, start, end):
        return NS(name=name, device_type=dev, time_range=NS(start=start, end=end))

    def test_filters_and_orders(self):
        events = [self.ev("aten::mm", self.CPU, 0.0, 50.0),
                  self.ev("triton_poi_fused_add_0", self.CUDA, 30.0, 32.5),
                  self.ev("Memcpy HtoD (Pageable -> Device)", self.CUDA, 1.0, 9.0),
                  self.ev(GEMM, self.CUDA, 10.0, 25.25),
                  self.ev("Memset (Device)", self.CUDA, 26.0, 27.0),
                  NS(name="old_kernel", device_type=self.CUDA, cuda_time=4.0)]  # no time_range: start 0
        got = train_torch.kernel_events(self.torch, NS(events=lambda: events))
        self.assertEqual(got, [{"name": "old_kernel", "us": 4.0}, {"name": GEMM, "us": 15.25},
                               {"name": "triton_poi_fused_add_0", "us": 2.5}])
        self.assertEqual(kt.parse_json(json.dumps(got))[1], (GEMM, 15.25))  # what kernel_table reads back


if __name__ == "__main__":
    unittest.main()
