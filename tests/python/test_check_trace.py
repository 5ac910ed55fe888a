#!/usr/bin/env python3
"""scripts/check_trace.py on synthetic traces: what it rejects, and the overlap arithmetic on a hand-computed case.
Standard library only:  python3 tests/python/test_check_trace.py
"""
import io
import json
import os
import sys
import tempfile
import unittest
from contextlib import redirect_stdout

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
import check_trace  # noqa: E402


def meta(pid, tracks):
    ev = [{"name": "process_name", "ph": "M", "ts": 0, "pid": pid, "tid": 0, "args": {"name": f"rank {pid}"}}]
    for tid, name in tracks:
        ev.append({"name": "thread_name", "ph": "M", "ts": 0, "pid": pid, "tid": tid, "args": {"name": name}})
    return ev


def x(name, cat, pid, tid, ts, dur, **args):
    e = {"name": name, "cat": cat, "ph": "X", "ts": ts, "dur": dur, "pid": pid, "tid": tid}
    if args:
        e["args"] = args
    return e


def step_trace(pid):
    """One rank's step as our profiler writes it (microseconds). GPU compute leaves: blocks [100, 300) and
    [300, 500), step [900, 1000); 'backward' [100, 800) also spans the wait for the all-reduce [400, 800)."""
    return {"traceEvents": meta(pid, [(0, "host"), (2, "comm stream"), (100, "cuda stream 0")]) + [
        x("backward", "host", pid, 0, 90, 720),
        x("all_reduce 25.0 MB", "comm", pid, 2, 400, 400, bytes=25_000_000, group="world", clock="gpu"),
        x("backward", "gpu", pid, 100, 100, 700),
        x("model.blocks.1", "gpu", pid, 100, 100, 200),
        x("model.blocks.0", "gpu", pid, 100, 300, 200),
        x("step", "gpu", pid, 100, 900, 100),
    ]}


class CheckTrace(unittest.TestCase):
    def run_tool(self, traces, *flags):
        with tempfile.TemporaryDirectory() as d:
            paths = []
            for i, t in enumerate(traces):
                paths.append(os.path.join(d, f"t.json.rank{i}"))
                with open(paths[-1], "w") as f:
                    json.dump(t, f)
            out = io.StringIO()
            with redirect_stdout(out):
                rc = check_trace.main(paths + list(flags))
            return rc, out.getvalue()

    def test_overlap_of_two_ranks(self):
        rc, out = self.run_tool([step_trace(0), step_trace(1)], "--json")
        self.assertEqual(rc, 0, out)
        rep = json.loads(out)
        self.assertEqual([r["rank"] for r in rep["ranks"]], [0, 1])
        r = rep["ranks"][0]
        self.assertEqual(r["compute_source"], "gpu")
        self.assertAlmostEqual(r["compute_ms"], 0.5)     # leaves: 200 + 200 + 100 us
        self.assertAlmostEqual(r["comm_ms"], 0.4)
        self.assertAlmostEqual(r["overlapped_ms"], 0.1)  # [400, 500)
        self.assertAlmostEqual(r["overlap"], 0.25)
        self.assertEqual(r["comm_bytes"], 25_000_000)
        rc, out = self.run_tool([step_trace(0)], "--json", "--all-ranges")
        self.assertAlmostEqual(json.loads(out)["ranks"][0]["overlap"], 1.0)  # 'backward' covers the wait
        rc, out = self.run_tool([step_trace(0)], "--json", "--exclude-compute", "^(model|backward)")
        self.assertAlmostEqual(json.loads(out)["ranks"][0]["compute_ms"], 0.1)

    def test_rejects_broken_traces(self):
        cases = {
            "goes back": lambda t: t["traceEvents"][-2].update(ts=50),
            "negative dur": lambda t: t["traceEvents"][-1].update(dur=-1),
            "missing 'pid'": lambda t: t["traceEvents"][-1].pop("pid"),
            "no thread_name": lambda t: t["traceEvents"].pop(2),
            "no process_name": lambda t: t["traceEvents"].pop(0),
            "unexpected ph": lambda t: t["traceEvents"][-1].update(ph="B"),
        }
        for what, breaks in cases.items():
            t = step_trace(0)
            breaks(t)
            rc, out = self.run_tool([t])
            self.assertEqual(rc, 1, what)
            self.assertIn("INVALID", out, what)
            self.assertIn(what, out)
        rc, out = self.run_tool([{"events": []}])
        self.assertEqual(rc, 1)
        self.assertIn("no traceEvents", out)

    def test_lenient_accepts_kineto_style(self):
        t = {"traceEvents": [
            {"name": "ampere_gemm", "cat": "kernel", "ph": "X", "ts": 200, "dur": 100, "pid": 0, "tid": 7},
            {"name": "ncclDevKernel_AllReduce_Sum_f32", "cat": "kernel", "ph": "X", "ts": 250, "dur": 100,
             "pid": 0, "tid": 13},
            {"name": "ampere_gemm", "cat": "kernel", "ph": "X", "ts": 100, "dur": 50, "pid": 0, "tid": 7},
            {"name": "cudaLaunchKernel", "ph": "i", "ts": 1, "pid": 0, "tid": 1, "s": "t"},
        ]}
        self.assertEqual(self.run_tool([t])[0], 1)  # out of order, unnamed tracks, an instant event
        rc, out = self.run_tool([t], "--lenient", "--json")
        self.assertEqual(rc, 0, out)
        r = json.loads(out)["ranks"][0]
        self.assertAlmostEqual(r["comm_ms"], 0.1)
        self.assertAlmostEqual(r["overlap"], 0.5)


if __name__ == "__main__":
    unittest.main()
