#!/usr/bin/env python3
"""Validate Chrome traces and report compute/communication overlap per rank.

  scripts/check_trace.py TRACE [TRACE...] [--lenient] [--all-ranges] [--exclude-compute REGEX] [--json]
                                          [--png OUT.png] [--window START_MS,END_MS]

TRACE: a Chrome trace JSON ({"traceEvents": [...]} or a bare event list), e.g. `dscpp train --trace t.json` (one
file, or t.json.rank0, t.json.rank1, ... under data parallelism: pass them all; each rank is one pid).

Validation (the rules DeepSpeed.cpp's TraceWriter promises, include/dscpp/profiler/trace.h): every event has name,
ph, ts, pid, tid; complete events ("X") have a numeric dur >= 0; timestamps never decrease within a (pid, tid)
track; every track with events has a thread_name and every pid a process_name. --lenient accepts other producers
(PyTorch/Kineto traces): other event phases are skipped, file order and missing names are not errors.
Exit status 1 on an invalid trace (2 on unreadable input).

Report, per rank (pid), over the whole trace (a trace of one training step gives that step):
  compute ms   union of GPU compute intervals: the leaf ranges (those containing no other range of their track) of
               our "cuda stream N" tracks (cat "gpu", profiler ranges timed by CUDA events), or Kineto kernels that
               are not NCCL's; with no GPU events, the host ranges (cat "host"). Leaves only, because an outer range
               (our "backward") also spans the compute stream's wait for the gradient all-reduce; --all-ranges counts
               every range; --exclude-compute drops ranges by name.
  comm ms      union of communication intervals: cat "comm" (our "comm stream" / "communication" tracks) or NCCL
               kernels in a Kineto trace.
  overlap      the share of comm time during which compute runs too: |comm ∩ compute| / |comm|.
--png renders the tracks of every rank (one screen: the whole trace, or --window in ms from its start) with
matplotlib when it is installed; without it the PNG is skipped with a note. Validation needs only the standard
library.
"""
import argparse
import json
import re
import sys
from collections import defaultdict


def load_events(paths):
    """All events of the given files, each tagged with its file name (for messages)."""
    events = []
    for path in paths:
        try:
            with open(path) as f:
                data = json.load(f)
        except (OSError, ValueError) as e:
            raise SystemExit(f"check_trace: cannot read {path}: {e}") from None
        if isinstance(data, dict):
            if not isinstance(data.get("traceEvents"), list):
                return None, f"{path}: no traceEvents array"
            evs = data["traceEvents"]
        elif isinstance(data, list):
            evs = data
        else:
            return None, f"{path}: not a trace (expected an object or an array)"
        events.extend((path, e) for e in evs)
    return events, ""


def is_num(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def validate(events, lenient):
    """First problem found ("" when valid) and the complete events as dicts."""
    last_ts = {}
    named_threads, named_pids, pids = set(), set(), set()
    complete = []
    for i, (path, e) in enumerate(events):
        at = f"{path}: event {i} ({json.dumps(e)[:120]}): "
        if not isinstance(e, dict):
            return at + "not an object", []
        ph = e.get("ph")
        if lenient and ph not in ("X", "M"):
            continue
        for k in ("name", "ph", "ts", "pid", "tid"):
            if k not in e:
                if lenient and ph == "M" and k == "ts":
                    continue
                return at + f"missing '{k}'", []
        if ph == "M":
            if e["name"] == "thread_name":
                named_threads.add((e["pid"], e["tid"]))
            elif e["name"] == "process_name":
                named_pids.add(e["pid"])
            continue
        if not is_num(e["ts"]):
            return at + "ts is not a number", []
        if not lenient and not (isinstance(e["pid"], int) and isinstance(e["tid"], int)):
            return at + "pid/tid are not integers", []
        if ph != "X":
            return at + f"unexpected ph '{ph}'", []
        if not is_num(e.get("dur")):
            return at + "X event without a numeric dur", []
        if e["dur"] < 0:
            return at + "negative dur", []
        track = (e["pid"], e["tid"])
        order_key = (path, track)  # order is a property of each file (one per rank under data parallelism)
        if not lenient and order_key in last_ts and e["ts"] < last_ts[order_key]:
            return at + f"timestamp goes back on its track (previous {last_ts[order_key]})", []
        last_ts[order_key] = e["ts"]
        pids.add(e["pid"])
        complete.append(e)
    if not lenient:
        for track in sorted({t for _, t in last_ts}, key=str):
            if track not in named_threads:
                return f"track pid {track[0]} tid {track[1]} has no thread_name", []
        for p in sorted(pids, key=str):
            if p not in named_pids:
                return f"pid {p} has no process_name", []
    return "", complete


def thread_names(events):
    names = {}
    for _, e in events:
        if isinstance(e, dict) and e.get("ph") == "M" and e.get("name") == "thread_name":
            names[(e.get("pid"), e.get("tid"))] = str(e.get("args", {}).get("name", ""))
    return names


def kind(e, tnames):
    """'compute', 'comm', 'host' or None for one complete event."""
    cat = str(e.get("cat", ""))
    name = str(e.get("name", ""))
    tname = tnames.get((e["pid"], e["tid"]), "")
    if cat == "comm" or tname in ("comm stream", "communication"):
        return "comm"
    if cat == "kernel":  # Kineto (PyTorch profiler)
        return "comm" if "nccl" in name.lower() else "compute"
    if cat == "gpu" or tname.startswith("cuda stream"):
        return "compute"
    if cat == "host" or tname == "host":
        return "host"
    return None


def union(intervals):
    out = []
    for b, e in sorted(intervals):
        if out and b <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([b, e])
    return out


def length(u):
    return sum(e - b for b, e in u)


def intersection(a, b):
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            total += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def leaves(intervals):
    """The intervals of one track that contain no other (ranges of a stream nest properly)."""
    evs = sorted(intervals, key=lambda x: (x[0], -x[1]))
    leaf = [True] * len(evs)
    stack = []
    for i, (b, e) in enumerate(evs):
        if e <= b:  # empty (event clocks have 0.5 us resolution): adds nothing, hides no parent
            continue
        while stack and evs[stack[-1]][1] <= b:  # ends before this one starts: not its parent
            stack.pop()
        if stack and e <= evs[stack[-1]][1]:
            leaf[stack[-1]] = False
        stack.append(i)
    return [x for x, keep in zip(evs, leaf) if keep]


def analyse(complete, tnames, exclude, all_ranges=False):
    """Per pid: compute/comm unions (microseconds) and a few counts."""
    by_pid = defaultdict(lambda: {"compute": [], "comm": [], "host": [], "comm_ops": 0, "comm_bytes": 0})
    by_track = defaultdict(list)  # (pid, tid, kind) -> compute or host intervals, reduced to leaves below
    for e in complete:
        k = kind(e, tnames)
        if k is None:
            continue
        if k in ("compute", "host") and exclude and exclude.search(str(e["name"])):
            continue
        iv = (float(e["ts"]), float(e["ts"]) + float(e["dur"]))
        if k in ("compute", "host"):
            by_track[(e["pid"], e["tid"], k)].append(iv)
            continue
        r = by_pid[e["pid"]]
        r[k].append(iv)
        if k == "comm":
            r["comm_ops"] += 1
            b = e.get("args", {}).get("bytes")
            if is_num(b):
                r["comm_bytes"] += b
    for (pid, _, k), ivs in by_track.items():
        by_pid[pid][k].extend(ivs if all_ranges else leaves(ivs))
    rows = []
    for pid in sorted(by_pid, key=str):
        r = by_pid[pid]
        source = "gpu" if r["compute"] else "host"
        compute = union(r["compute"] or r["host"])
        comm = union(r["comm"])
        ov = intersection(comm, compute)
        every = compute + comm
        span = (max(e for _, e in every) - min(b for b, _ in every)) if every else 0.0
        rows.append({"rank": pid, "compute_source": source, "span_ms": span / 1e3, "compute_ms": length(compute) / 1e3,
                     "comm_ms": length(comm) / 1e3, "overlapped_ms": ov / 1e3,
                     "overlap": ov / length(comm) if comm else None, "comm_ops": r["comm_ops"],
                     "comm_bytes": r["comm_bytes"]})
    return rows


def print_report(rows):
    print(f"{'rank':>6} {'compute':>7} {'span ms':>9} {'compute ms':>11} {'comm ms':>9} {'overlapped':>11} "
          f"{'overlap':>8} {'comm ops':>9} {'comm MB':>9}")
    for r in rows:
        ov = "-" if r["overlap"] is None else f"{100 * r['overlap']:.1f}%"
        print(f"{str(r['rank']):>6} {r['compute_source']:>7} {r['span_ms']:9.3f} {r['compute_ms']:11.3f} "
              f"{r['comm_ms']:9.3f} {r['overlapped_ms']:11.3f} {ov:>8} {r['comm_ops']:9d} "
              f"{r['comm_bytes'] / 1e6:9.1f}")


def render_png(complete, tnames, path, window):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"check_trace: matplotlib is not installed; {path} not written", file=sys.stderr)
        return False
    if not complete:
        print("check_trace: no complete events to draw", file=sys.stderr)
        return False
    t0 = min(float(e["ts"]) for e in complete)
    lo, hi = (window[0] * 1e3, window[1] * 1e3) if window else (0.0, max(float(e["ts"]) + float(e["dur"])
                                                                          for e in complete) - t0)
    tracks = sorted({(e["pid"], e["tid"]) for e in complete}, key=lambda t: (str(t[0]), str(t[1])))
    colors = {"compute": "tab:blue", "comm": "tab:red", "host": "tab:gray", None: "tab:olive"}
    fig, ax = plt.subplots(figsize=(16, 1 + 0.45 * len(tracks)))
    for row, track in enumerate(tracks):
        bars = defaultdict(list)
        for e in complete:
            if (e["pid"], e["tid"]) != track:
                continue
            b, d = float(e["ts"]) - t0, float(e["dur"])
            if b + d < lo or b > hi:
                continue
            bars[kind(e, tnames)].append((b / 1e3, max(d / 1e3, 1e-4)))
        for k, segs in bars.items():
            ax.broken_barh(segs, (row - 0.4, 0.8), facecolors=colors[k], edgecolors="black", linewidth=0.2,
                           alpha=0.6)
    ax.set_yticks(range(len(tracks)))
    ax.set_yticklabels([f"rank {p}: {tnames.get((p, t), 'tid ' + str(t))}" for p, t in tracks], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(lo / 1e3, hi / 1e3)
    ax.set_xlabel("ms from the first event")
    ax.set_title("blue: compute, red: communication, gray: host ranges")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"check_trace: wrote {path}", file=sys.stderr)
    return True


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--lenient", action="store_true", help="accept traces of other producers (Kineto)")
    ap.add_argument("--all-ranges", action="store_true", help="compute = every range, not only the leaves")
    ap.add_argument("--exclude-compute", default="", help="regex of range names not counted as compute")
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    ap.add_argument("--png", default="", help="render the tracks to this PNG (needs matplotlib)")
    ap.add_argument("--window", default="", help="START_MS,END_MS of the PNG, from the first event")
    args = ap.parse_args(argv)
    window = None
    if args.window:
        try:
            window = tuple(float(x) for x in args.window.split(","))
            assert len(window) == 2 and window[1] > window[0]
        except (ValueError, AssertionError):
            ap.error("--window needs START_MS,END_MS with END_MS > START_MS")

    events, problem = load_events(args.traces)
    if events is None:
        print(f"check_trace: INVALID: {problem}")
        return 1
    problem, complete = validate(events, args.lenient)
    if problem:
        print(f"check_trace: INVALID: {problem}")
        return 1
    tnames = thread_names(events)
    rows = analyse(complete, tnames, re.compile(args.exclude_compute) if args.exclude_compute else None,
                   args.all_ranges)
    if args.json:
        print(json.dumps({"valid": True, "events": len(complete), "ranks": rows}, indent=1))
    else:
        tracks = {(e["pid"], e["tid"]) for e in complete}
        print(f"check_trace: valid: {len(complete)} complete events on {len(tracks)} tracks, "
              f"{len({p for p, _ in tracks})} ranks")
        print_report(rows)
    if args.png:
        render_png(complete, tnames, args.png, window)
    return 0


if __name__ == "__main__":
    sys.exit(main())
