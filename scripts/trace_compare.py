#!/usr/bin/env python3
"""Where a slower run's step time went: two Chrome traces of one training step each, side by side.

  scripts/trace_compare.py BASE.json OTHER.json [--rank R] [--top 12]

For each trace (one rank's pid; default the first): the GPU span of the step on the compute streams, the busy time
(union of leaf ranges, as scripts/check_trace.py counts them), the time inside the span outside every leaf range
(kernels that no leaf range covers, such as a block's norm backward between its attn and mlp ranges, plus true idle
gaps), the communication time, and the leaf time per phase (forward / backward / step). Then the leaf ranges, grouped by name with block
indices folded (model.blocks.*), whose total GPU time grew the most from BASE to OTHER: a range that grows while
communication overlaps it is compute slowed by contention; growth outside the leaves is uncovered kernels slowed the
same way, or waits (the host, an exposed collective).
Typical use: dp_bench --trace on 1 GPU (BASE) and on N GPUs (OTHER).
"""
import argparse
import os
import re
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_trace as ct  # noqa: E402


def summarise(path, rank):
    events, err = ct.load_events([path])
    if events is None:
        raise SystemExit(f"trace_compare: {err}")
    tnames = ct.thread_names(events)
    complete = [e for _, e in events if isinstance(e, dict) and e.get("ph") == "X"]
    pids = sorted({e["pid"] for e in complete})
    pid = rank if rank is not None else pids[0]
    tracks = defaultdict(list)
    comm = []
    for e in complete:
        if e["pid"] != pid:
            continue
        k = ct.kind(e, tnames)
        b = float(e["ts"])
        iv = (b, b + float(e["dur"]))
        if k == "compute":
            tracks[e["tid"]].append((iv, e))
        elif k == "comm":
            comm.append(iv)
    leaves = []
    for items in tracks.values():
        keep = set(ct.leaves([iv for iv, _ in items]))
        leaves += [(iv, e) for iv, e in items if iv in keep]
    busy = ct.union([iv for iv, _ in leaves])
    span = (busy[-1][1] - busy[0][0]) if busy else 0.0
    phase, by_name = defaultdict(float), defaultdict(float)
    for (b, e_), e in leaves:
        phase[str(e.get("args", {}).get("phase", "?"))] += e_ - b
        by_name[re.sub(r"\.\d+(\.|$)", r".*\1", str(e["name"]))] += e_ - b
    return {"span": span, "busy": ct.length(busy), "comm": ct.length(ct.union(comm)), "phase": phase,
            "by_name": by_name, "leaves": len(leaves)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("base")
    ap.add_argument("other")
    ap.add_argument("--rank", type=int, default=None)
    ap.add_argument("--top", type=int, default=12)
    a = ap.parse_args()
    s = [summarise(a.base, a.rank), summarise(a.other, a.rank)]
    ms = lambda us: f"{us / 1e3:9.3f}"
    print(f"{'ms':24} {'base':>9} {'other':>9} {'diff':>9}")
    rows = [("GPU span", "span"), ("busy (leaf union)", "busy"), ("communication", "comm")]
    for label, k in rows:
        print(f"{label:24} {ms(s[0][k])} {ms(s[1][k])} {ms(s[1][k] - s[0][k])}")
    outside = [x["span"] - x["busy"] for x in s]
    print(f"{'outside leaf ranges':24} {ms(outside[0])} {ms(outside[1])} {ms(outside[1] - outside[0])}")
    for p in sorted(set(s[0]["phase"]) | set(s[1]["phase"])):
        a0, a1 = s[0]["phase"].get(p, 0.0), s[1]["phase"].get(p, 0.0)
        print(f"{'leaf time, ' + p:24} {ms(a0)} {ms(a1)} {ms(a1 - a0)}")
    names = set(s[0]["by_name"]) | set(s[1]["by_name"])
    grow = sorted(names, key=lambda n: s[1]["by_name"].get(n, 0.0) - s[0]["by_name"].get(n, 0.0), reverse=True)
    print(f"\nleaf ranges that grew most (ms, all blocks together)")
    for n in grow[: a.top]:
        a0, a1 = s[0]["by_name"].get(n, 0.0), s[1]["by_name"].get(n, 0.0)
        print(f"{n[:40]:40} {ms(a0)} {ms(a1)} {ms(a1 - a0)}")


if __name__ == "__main__":
    main()
