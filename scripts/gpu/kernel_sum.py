#!/usr/bin/env python3
"""Per-kernel GPU time of a bench/cupti_trace.cpp CSV, over the last `--frac` of the trace's kernels (the timed
round, after warm-up): count, total and mean microseconds, share of the kernel sum, and the span's wall time.

    python3 scripts/gpu/kernel_sum.py trace.csv [--frac 0.5] [--top 20] [--steps 128] [--from-last REGEX]

--from-last REGEX: instead of --frac, the records from the last kernel whose name matches REGEX on (e.g.
"embedding_fwd" for a run's last forward).
"""
import argparse
import collections
import csv
import re

ap = argparse.ArgumentParser()
ap.add_argument("csv")
ap.add_argument("--frac", type=float, default=0.5)
ap.add_argument("--top", type=int, default=20)
ap.add_argument("--steps", type=int, default=0, help="divide totals by this many steps")
ap.add_argument("--from-last", metavar="REGEX", help="start at the last kernel whose name matches REGEX")
a = ap.parse_args()
rows = []
with open(a.csv) as f:
    for r in csv.reader(f):
        if len(r) >= 6 and r[0] in ("kernel", "memcpy", "memset"):
            rows.append((int(r[1]), int(r[2]), r[0] + ":" + r[5][:90]))
rows.sort()
if a.from_last:
    hits = [i for i, r in enumerate(rows) if r[2].startswith("kernel:") and re.search(a.from_last, r[2])]
    if not hits:
        raise SystemExit(f"no kernel matching {a.from_last!r} in {a.csv}")
    rows = rows[hits[-1]:]
else:
    rows = rows[int(len(rows) * (1 - a.frac)):]
if not rows:
    raise SystemExit("no kernels in " + a.csv)
span = (rows[-1][1] - rows[0][0]) / 1e3
tot = collections.defaultdict(lambda: [0, 0.0])
for s, e, n in rows:
    tot[n][0] += 1
    tot[n][1] += (e - s) / 1e3
busy = sum(v[1] for v in tot.values())
div = a.steps or 1
print(f"span {span:.0f} us, kernel sum {busy:.0f} us ({100 * busy / span:.0f}% busy), {len(rows)} records"
      + (f"; per step: span {span / div:.1f} us, kernels {busy / div:.1f} us" if a.steps else ""))
print(f"{'count':>7} {'total us':>10} {'mean us':>8} {'%':>5}  name")
for n, (c, t) in sorted(tot.items(), key=lambda kv: -kv[1][1])[: a.top]:
    print(f"{c:>7} {t:>10.0f} {t / c:>8.2f} {100 * t / busy:>5.1f}  {n}")
