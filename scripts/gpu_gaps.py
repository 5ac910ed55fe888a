#!/usr/bin/env python3
"""Where the GPU's time goes in one training step, from bench/cupti_trace.cpp's CSV: idle holes, streams, and
(with --base) which kernels got slower than in another run.

    CUDA_INJECTION64_PATH=build-gpu/bench/libdscpp_cupti_trace.so DSCPP_CUPTI_OUT=/tmp/one.csv \\
    NVTX_INJECTION64_PATH=/usr/local/cuda/lib64/libcupti.so \\
        build-gpu/bench/dp_bench --model gpt2 --warmup 3 --steps 2 --nvtx-step
    python3 scripts/gpu_gaps.py /tmp/two.csv.rank0 [--base /tmp/one.csv] [--min-us 15] [--top 20]

The step is the NVTX range --range (dp_bench/train_bench --nvtx-step mark "dscpp_step"); without one, the stretch
between two consecutive --sync calls that holds the most GPU time among the last four. Its GPU work is what API
calls inside it launched. The compute stream is the stream with the most kernel time. Every hole of at least --min-us
in the compute stream is listed with the work on each side, what ran on other streams meanwhile, and whether its
next work was launched after it opened (the host's doing: a synchronisation, a slow call) or before (a wait on
another stream). --base: kernel time by name on the compute stream against another trace (e.g. 1 GPU vs N GPUs).
--ranks: one line per rank's trace instead, lined up on the host clock the ranks share: the straggler is the rank
whose compute kernels take longest and whose communication kernels wait least.
"""
import argparse
import csv
import os
import sys
from collections import defaultdict

ms = lambda ns: ns / 1e6


def load(path):
    api, work, ranges = [], [], []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            row = (int(r["start"]), int(r["end"]), int(r["correlation"]), int(r["stream"]), r["name"], r["kind"])
            if r["kind"] in ("runtime", "driver"):
                api.append(row)
            elif r["kind"].startswith("range_"):
                ranges.append(row)
            else:
                work.append(row)
    if not api or not work:
        sys.exit(f"gpu_gaps.py: {path} holds no API calls or no GPU work")
    api.sort()
    return api, work, ranges


def step_window(api, work, ranges, name, sync):
    """(host start, host end, how) of the step."""
    starts = {r[2]: r[0] for r in ranges if r[5] == "range_start" and r[4] == name}
    for r in ranges:
        if r[5] == "range_end" and r[2] in starts:
            return starts[r[2]], r[0], f"NVTX range '{name}'"
    syncs = [x for x in api if x[4].startswith(sync)]
    if len(syncs) < 2:
        sys.exit(f"gpu_gaps.py: no NVTX range '{name}' and fewer than two {sync} calls")
    best = None
    for s0, s1 in list(zip(syncs, syncs[1:]))[-4:]:
        corr = {c for st, _, c, _, _, _ in api if s0[1] <= st <= s1[0]}
        busy = sum(w[1] - w[0] for w in work if w[2] in corr)
        if best is None or busy > best[0]:
            best = (busy, s0[1], s1[0])
    return best[1], best[2], f"between two {sync}"


def step_work(path, a):
    api, work, ranges = load(path)
    hs, he, how = step_window(api, work, ranges, a.range, a.sync)
    corr = {c for st, _, c, _, _, _ in api if hs <= st <= he}
    mine = sorted(w for w in work if w[2] in corr)
    if not mine:
        sys.exit(f"gpu_gaps.py: {path}: no GPU work launched inside the step")
    per_stream = defaultdict(int)
    for w in mine:
        if w[5] == "kernel":
            per_stream[w[3]] += w[1] - w[0]
    compute = max(per_stream, key=per_stream.get)
    return api, mine, hs, he, how, per_stream, compute


def union(intervals):
    total, cur = 0, None
    for s, e in sorted(intervals):
        if cur is None or s > cur[1]:
            if cur:
                total += cur[1] - cur[0]
            cur = [s, e]
        else:
            cur[1] = max(cur[1], e)
    return total + (cur[1] - cur[0] if cur else 0)


def kernel_times(mine, stream):
    t = defaultdict(lambda: [0, 0])
    for w in mine:
        if w[5] == "kernel" and w[3] == stream:
            t[w[4]][0] += w[1] - w[0]
            t[w[4]][1] += 1
    return t


def ranks_table(paths, a):
    rows = []
    for p in paths:
        _, mine, _, _, _, per_stream, compute = step_work(p, a)
        other = sum(t for s, t in per_stream.items() if s != compute)
        rows.append((p, mine[0][0], max(w[1] for w in mine), per_stream[compute], other))
    t0 = min(r[1] for r in rows)
    print("| trace | first work ms | last work ms | compute kernels ms | other streams' kernels ms |")
    print("|---|---:|---:|---:|---:|")
    for p, s, e, c, o in rows:
        print(f"| {os.path.basename(p)} | {ms(s - t0):.3f} | {ms(e - t0):.3f} | {ms(c):.2f} | {ms(o):.2f} |")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv", nargs="+", help="one trace (several with --ranks)")
    ap.add_argument("--ranks", action="store_true", help="one line per trace: the ranks of one job side by side")
    ap.add_argument("--base", help="another trace to compare the compute stream's kernel times with")
    ap.add_argument("--range", default="dscpp_step")
    ap.add_argument("--sync", default="cudaDeviceSynchronize")
    ap.add_argument("--min-us", type=float, default=15.0)
    ap.add_argument("--top", type=int, default=20)
    a = ap.parse_args(argv)
    if a.ranks:
        ranks_table(a.csv, a)
        return
    if len(a.csv) != 1:
        ap.error("several traces need --ranks")
    a.csv = a.csv[0]
    api, mine, hs, he, how, per_stream, compute = step_work(a.csv, a)
    launch = {}  # correlation id -> (start, name) of the first API call that carries it
    for st, _, c, _, name, _ in api:
        launch.setdefault(c, (st, name))

    span0, span1 = mine[0][0], max(w[1] for w in mine)
    span = span1 - span0
    busy_all = union([(w[0], w[1]) for w in mine])
    comp = [w for w in mine if w[3] == compute]
    busy_comp = union([(w[0], w[1]) for w in comp])
    print(f"step ({how}): host {ms(he - hs):.2f} ms; GPU span {ms(span):.2f} ms, any stream busy "
          f"{ms(busy_all):.2f} ms (idle {ms(span - busy_all):.2f} ms, {100 * (span - busy_all) / span:.1f}%), "
          f"compute stream {compute} busy {ms(busy_comp):.2f} ms ({100 * busy_comp / span:.1f}%)")
    # CUPTI's timestamps share one clock across the processes of a host: these line ranks' traces up.
    print(f"  clock: host start {hs / 1e6:.3f} ms, GPU first work {span0 / 1e6:.3f} ms, last {span1 / 1e6:.3f} ms")
    for s, t in sorted(per_stream.items(), key=lambda kv: -kv[1]):
        print(f"  stream {s}: kernels {ms(t):.2f} ms")

    holes, cur_end, prev = [], comp[0][0], None
    for w in comp:
        if w[0] > cur_end:
            holes.append((w[0] - cur_end, cur_end, prev, w))
        if w[1] > cur_end:
            cur_end, prev = w[1], w
    big = [h for h in holes if h[0] >= a.min_us * 1e3]
    host = [h for h in big if launch[h[3][2]][0] > h[1]]
    print(f"compute-stream holes: {len(holes)}, {ms(sum(h[0] for h in holes)):.2f} ms; of at least {a.min_us:.0f} "
          f"us: {len(big)}, {ms(sum(h[0] for h in big)):.2f} ms, of which host-bound {len(host)}, "
          f"{ms(sum(h[0] for h in host)):.2f} ms")

    others = [w for w in mine if w[3] != compute]

    def beside(t0, t1):  # work on other streams overlapping [t0, t1]
        names = defaultdict(int)
        for w in others:
            if w[0] < t1 and w[1] > t0:
                names[w[4][:28]] += min(w[1], t1) - max(w[0], t0)
        return ", ".join(f"{n} {v / 1e3:.0f}us" for n, v in sorted(names.items(), key=lambda kv: -kv[1])[:2]) or "-"

    print("\n| hole us | at ms | before | after | launch vs hole | other streams meanwhile |")
    print("|---:|---:|---|---|---|---|")
    for g, t, before, after in sorted(big, key=lambda h: -h[0])[: a.top]:
        lt, lname = launch[after[2]]
        print(f"| {g / 1e3:.1f} | {ms(t - span0):.2f} | {before[4][:40] if before else '-'} | {after[4][:40]} | "
              f"{lname[:24]} {(lt - t) / 1e3:+.1f} us | {beside(t, t + g)} |")

    if a.base:
        _, bmine, _, _, _, _, bcompute = step_work(a.base, a)
        mine_t, base_t = kernel_times(mine, compute), kernel_times(bmine, bcompute)
        tot = sum(v[0] for v in mine_t.values()) - sum(v[0] for v in base_t.values())
        print(f"\ncompute-stream kernel time against {a.base}: {tot / 1e6:+.2f} ms; the largest changes:")
        print("| kernel | calls | base ms | this ms | delta ms |")
        print("|---|---:|---:|---:|---:|")
        keys = set(mine_t) | set(base_t)
        for k in sorted(keys, key=lambda k: -abs(mine_t[k][0] - base_t[k][0]))[: a.top]:
            print(f"| {k[:60]} | {mine_t[k][1]}/{base_t[k][1]} | {ms(base_t[k][0]):.2f} | {ms(mine_t[k][0]):.2f} | "
                  f"{ms(mine_t[k][0] - base_t[k][0]):+.2f} |")

    totals = defaultdict(lambda: [0, 0])
    for st, en, _, _, name, kind in api:
        if hs <= st <= he:
            totals[(kind, name)][0] += 1
            totals[(kind, name)][1] += en - st
    print("\nhost API calls in the step, by total time:")
    for (kind, name), (c, tt) in sorted(totals.items(), key=lambda kv: -kv[1][1])[:10]:
        print(f"  {kind:7s} {name:44s} {c:6d} calls {ms(tt):9.2f} ms")


if __name__ == "__main__":
    main()
