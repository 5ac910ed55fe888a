#!/usr/bin/env python3
"""Where the GPU sits idle during one training step, from bench/cupti_trace.cpp's CSV.

    CUDA_INJECTION64_PATH=build-gpu/bench/libdscpp_cupti_trace.so DSCPP_CUPTI_OUT=/tmp/acts.csv \\
        build-gpu/bench/train_bench --models llama-1b --batch 16 --warmup 3 --steps 1
    python3 scripts/gpu_gaps.py /tmp/acts.csv [--sync cudaDeviceSynchronize] [--min-us 15] [--top 20]

The step is the stretch between two consecutive calls of --sync (the benches synchronise before and after each
step) that holds the most GPU time, among the last four. Its GPU work is what API calls inside it launched; the span
runs from the first to the last of that work, busy time is the union of its kernels, copies and sets. Every hole of
at least --min-us is listed with the work on each side and what the host was doing when it opened. A hole whose next
work was launched after it opened is the host's doing (a synchronisation, a slow call, launch overhead); one whose
next work was queued before is a wait between streams.
"""
import argparse
import csv
import sys


def load(path):
    api, work = [], []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            row = (int(r["start"]), int(r["end"]), int(r["correlation"]), int(r["stream"]), r["name"], r["kind"])
            (api if r["kind"] in ("runtime", "driver") else work).append(row)
    if not api or not work:
        sys.exit(f"gpu_gaps.py: {path} holds no API calls or no GPU work")
    api.sort()
    return api, work


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--sync", default="cudaDeviceSynchronize")
    ap.add_argument("--min-us", type=float, default=15.0)
    ap.add_argument("--top", type=int, default=20)
    a = ap.parse_args()
    api, work = load(a.csv)
    launch = {}  # correlation id -> (start, name) of the first API call that carries it
    for st, _, c, _, name, _ in api:
        if c not in launch:
            launch[c] = (st, name)

    syncs = [x for x in api if x[4].startswith(a.sync)]
    if len(syncs) < 2:
        sys.exit(f"gpu_gaps.py: fewer than two {a.sync} calls; pass --sync NAME")
    best = None
    for s0, s1 in list(zip(syncs, syncs[1:]))[-4:]:
        lo, hi = s0[1], s1[0]
        corr = {c for st, _, c, _, _, _ in api if lo <= st <= hi}
        mine = sorted(w for w in work if w[2] in corr)
        busy = sum(w[1] - w[0] for w in mine)
        if mine and (best is None or busy > best[0]):
            best = (busy, lo, hi, mine)
    if best is None:
        sys.exit("gpu_gaps.py: no GPU work between the last synchronisations")
    _, hs, he, mine = best

    span0, span1 = mine[0][0], max(w[1] for w in mine)
    busy, holes, cur_end, prev = 0, [], span0, None
    for w in mine:
        if w[0] > cur_end:
            holes.append((w[0] - cur_end, cur_end, prev, w))
        if w[1] > cur_end:
            busy += w[1] - max(w[0], cur_end)
            cur_end, prev = w[1], w
    span = span1 - span0
    ms = lambda ns: ns / 1e6
    print(f"step: host {ms(he - hs):.2f} ms between two {a.sync}; GPU span {ms(span):.2f} ms, busy {ms(busy):.2f} "
          f"ms, idle {ms(span - busy):.2f} ms ({100 * (span - busy) / span:.1f}%) in {len(holes)} holes; the GPU "
          f"started {ms(span0 - hs):.3f} ms after the step's host start")
    big = [h for h in holes if h[0] >= a.min_us * 1e3]
    host_bound = [h for h in big if launch[h[3][2]][0] > h[1]]
    print(f"holes of at least {a.min_us:.0f} us: {len(big)}, {ms(sum(h[0] for h in big)):.2f} ms; next work launched "
          f"after the hole opened (host-bound): {len(host_bound)}, {ms(sum(h[0] for h in host_bound)):.2f} ms")

    def host_at(t):  # the longest API call in progress at t
        cur = None
        for st, en, _, _, name, _ in api:
            if st > t:
                break
            if en >= t and (cur is None or en - st > cur[1] - cur[0]):
                cur = (st, en, name)
        return f"{cur[2]} ({ms(cur[1] - cur[0]):.3f} ms)" if cur else "-"

    print("\n| hole us | at ms | before | after | its launch vs the hole | host when it opened |")
    print("|---:|---:|---|---|---|---|")
    for g, t, before, after in sorted(big, key=lambda h: -h[0])[: a.top]:
        lt, lname = launch[after[2]]
        print(f"| {g / 1e3:.1f} | {ms(t - span0):.2f} | {before[4][:48] if before else '-'} | {after[4][:48]} | "
              f"{lname} {(lt - t) / 1e3:+.1f} us | {host_at(t)} |")

    totals = {}
    for st, en, _, _, name, kind in api:
        if hs <= st <= he:
            c, tt = totals.get((kind, name), (0, 0))
            totals[(kind, name)] = (c + 1, tt + en - st)
    print("\nhost API calls in the step, by total time:")
    for (kind, name), (c, tt) in sorted(totals.items(), key=lambda kv: -kv[1][1])[:14]:
        print(f"  {kind:7s} {name:44s} {c:6d} calls {ms(tt):9.2f} ms")


if __name__ == "__main__":
    main()
