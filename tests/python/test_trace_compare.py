#!/usr/bin/env python3
"""scripts/trace_compare.py on two synthetic one-step traces with hand-computed differences.
Standard library only:  python3 tests/python/test_trace_compare.py
"""
import io
import json
import os
import sys
import tempfile
import unittest
from contextlib import redirect_stdout

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
import trace_compare  # noqa: E402


def trace(mlp_us, comm, gap_us=5):
    """One rank: two blocks' mlp (backward), an lm_head (forward), all on cuda stream 0, `gap_us` apart; an enclosing
    'backward' range that must not count as a leaf; optional comm ops [(ts, dur)] on the comm stream."""
    ev = [{"name": "process_name", "ph": "M", "ts": 0, "pid": 0, "tid": 0, "args": {"name": "rank 0"}},
          {"name": "thread_name", "ph": "M", "ts": 0, "pid": 0, "tid": 10, "args": {"name": "cuda stream 0"}},
          {"name": "thread_name", "ph": "M", "ts": 0, "pid": 0, "tid": 99, "args": {"name": "comm stream"}}]
    t, leaves = 0, []
    for name, dur, phase in [("model.blocks.1.mlp", mlp_us, "backward"), ("model.blocks.0.mlp", mlp_us, "backward"),
                             ("model.lm_head", 50, "forward")]:
        leaves.append({"name": name, "cat": "gpu", "ph": "X", "ts": t, "dur": dur, "pid": 0, "tid": 10,
                       "args": {"phase": phase}})
        t += dur + gap_us
    outer = {"name": "backward", "cat": "gpu", "ph": "X", "ts": 0, "dur": 2 * mlp_us + gap_us, "pid": 0, "tid": 10,
             "args": {"phase": "backward"}}
    ev += [outer] + leaves
    for ts, dur in comm:
        ev.append({"name": "all_reduce", "cat": "comm", "ph": "X", "ts": ts, "dur": dur, "pid": 0, "tid": 99,
                   "args": {"bytes": 100}})
    return {"traceEvents": ev}


class TraceCompare(unittest.TestCase):
    def run_compare(self, base, other):
        with tempfile.TemporaryDirectory() as d:
            paths = []
            for i, t in enumerate((base, other)):
                paths.append(os.path.join(d, f"t{i}.json"))
                with open(paths[-1], "w") as f:
                    json.dump(t, f)
            out = io.StringIO()
            sys.argv = ["trace_compare.py", *paths]
            with redirect_stdout(out):
                trace_compare.main()
            return out.getvalue()

    def row(self, text, label):
        line = next(l for l in text.splitlines() if l.startswith(label))
        return [float(x) for x in line[len(label):].split()]

    def test_growth_and_outside(self):
        # base: mlp 100 us each, gaps 5 us; other: mlp 130 us each, gaps 25 us, two comm ops of 40 us (one overlapping)
        text = self.run_compare(trace(100, []), trace(130, [(10, 40), (300, 40)], gap_us=25))
        self.assertEqual(self.row(text, "GPU span"), [0.260, 0.360, 0.100])    # 250+10 -> 310+50
        self.assertEqual(self.row(text, "busy (leaf union)"), [0.250, 0.310, 0.060])
        self.assertEqual(self.row(text, "communication"), [0.000, 0.080, 0.080])
        self.assertEqual(self.row(text, "outside leaf ranges"), [0.010, 0.050, 0.040])
        self.assertEqual(self.row(text, "leaf time, backward"), [0.200, 0.260, 0.060])
        self.assertEqual(self.row(text, "leaf time, forward"), [0.050, 0.050, 0.000])
        # block indices fold into one name; the enclosing 'backward' range is not a leaf
        self.assertEqual(self.row(text, "model.blocks.*.mlp"), [0.200, 0.260, 0.060])
        self.assertNotIn("\nbackward ", text)


if __name__ == "__main__":
    unittest.main()
