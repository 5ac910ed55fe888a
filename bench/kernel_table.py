#!/usr/bin/env python3
"""Where one training step's GPU time goes: kernel time by category, as markdown tables. Standard library only.

Inputs (the format is read from the content):
  * Nsight Compute CSV, `ncu --csv --print-units base --metrics gpu__time_duration.sum` (or `ncu --import R --csv
    --page raw ...`): the default details page (one row per kernel and metric, "Metric Name"/"Metric Unit"/"Metric
    Value" columns) or the raw page (one column per metric, a units row under the header). Lines before the header
    and lines that are not rows of the table (==PROF== messages, program output) are skipped.
  * JSON list of {"name": kernel name, "us": device microseconds}, as bench/train_torch.py --profile-step writes.

  kernel_table.py ours.csv [--label dscpp] [--step-ms 95.1]
                  [--compare torch.json --compare-label torch-compile --compare-step-ms 101.3]
                  [--top 15] [--gemm-tflop 8.2 --gemm-peak 678]

"% of step" is of --step-ms when given (the step's wall time; the row "gaps" is wall time minus the kernel sum:
launch gaps and idle GPU), else of the kernel sum. --gemm-tflop (GEMM work of one step, in TFLOP) adds the GEMM
row's achieved TFLOP/s and its share of --gemm-peak.
"""
import argparse
import csv
import json
import re
import sys

METRIC = "gpu__time_duration.sum"
NAME_COLUMNS = ("Kernel Name", "Function Name", "Demangled Name", "Name")
UNIT_US = {"ns": 1e-3, "nsecond": 1e-3, "nanosecond": 1e-3, "us": 1.0, "usecond": 1.0, "microsecond": 1.0,
           "ms": 1e3, "msecond": 1e3, "millisecond": 1e3, "s": 1e6, "second": 1e6}

# First match wins, on the lower-cased name. Order matters: flash/cuDNN attention kernels contain "cutlass" or
# "wgmma", grad-clipping norms ("NormTwoOps", "LpNorm") and the Inductor templates would otherwise land in norm or
# reduction. Inductor's reductions (triton_red_/triton_per_) without a norm or softmax hint count as reductions,
# its pointwise kernels (triton_poi_) fall through to elementwise.
CATEGORIES = [
    ("attention", r"flash|fmha|attention|attn|sdpa|cudnn"),
    ("GEMM", r"cutlass|cublas|xmma|nvjet|gemm|gemv|wgmma|splitkreduce|triton_tem_"),
    ("optimizer", r"adam|multi_tensor|foreach|lpnorm|normtwo|sum_squares|sgd_"),
    ("cross-entropy", r"cross_?entropy|softmax|nll|(^|[^a-z0-9])ce_(fwd|bwd)"),
    ("norm", r"layer_?norm|rms_?norm|norm(?!al)|gammabeta|rsqrt"),
    ("reduction/comm", r"nccl|all_?reduce|reduce_?scatter|all_?gather|reduce|triton_(red|per)_|dbias|sum_partials"),
]
OTHER = "elementwise+other"
ORDER = ["GEMM", "attention", "norm", "cross-entropy", "optimizer", "reduction/comm", OTHER]  # table rows
_RULES = [(c, re.compile(p)) for c, p in CATEGORIES]


def category(name):
    low = name.lower()
    for cat, rx in _RULES:
        if rx.search(low):
            return cat
    return OTHER


def _number(text):
    """ncu prints thousands separators ("12,345.6"); None for anything that is not a number ("n/a", a unit)."""
    try:
        return float(text.replace(",", "").strip())
    except ValueError:
        return None


def _to_us(value, unit, where):
    unit = (unit or "ns").strip()  # --print-units base: nanoseconds; no unit given means base
    if unit not in UNIT_US:
        raise ValueError(f"{where}: unknown time unit '{unit}' (run ncu with --print-units base)")
    return value * UNIT_US[unit]


def parse_ncu_csv(text, where="ncu csv"):
    """[(kernel name, us)] from an ncu CSV report, details or raw page."""
    lines = text.splitlines()
    head = None
    for i, line in enumerate(lines):
        if any(c in line for c in NAME_COLUMNS):
            cols = next(csv.reader([line]))
            if any(c in cols for c in NAME_COLUMNS) and (METRIC in cols or "Metric Name" in cols):
                head = i
                break
    if head is None:
        raise ValueError(f"{where}: no ncu CSV header with a kernel name and {METRIC} (was ncu run with --csv "
                         f"--metrics {METRIC}?)")
    cols = next(csv.reader([lines[head]]))
    name_col = next(cols.index(c) for c in NAME_COLUMNS if c in cols)
    details = METRIC not in cols
    if details:
        m_name, m_unit, m_value = (cols.index(c) for c in ("Metric Name", "Metric Unit", "Metric Value"))
    else:
        m_value, unit = cols.index(METRIC), None
    id_col = cols.index("ID") if "ID" in cols else None
    out, seen = [], {}  # details page: kernel ID -> index in out (one time per kernel)
    for line in lines[head + 1:]:
        if not line.strip() or line.startswith("=="):
            continue
        row = next(csv.reader([line]))
        if len(row) != len(cols):
            continue  # program output between the report's rows
        if details:
            # "Duration" is the same metric as shown by the SpeedOfLight section; the explicit metric wins.
            if row[m_name] not in (METRIC, "Duration"):
                continue
            v = _number(row[m_value])
            if v is None:
                continue
            k = row[id_col] if id_col is not None else len(out)
            if k in seen:
                if row[m_name] == METRIC:
                    out[seen[k]] = (row[name_col], _to_us(v, row[m_unit], where))
                continue
            seen[k] = len(out)
            out.append((row[name_col], _to_us(v, row[m_unit], where)))
            continue
        v = _number(row[m_value])
        if v is None:
            if not row[name_col].strip() and row[m_value].strip():
                unit = row[m_value].strip()  # the raw page's units row (checked by _to_us)
            continue
        out.append((row[name_col], _to_us(v, unit, where)))
    if not out:
        raise ValueError(f"{where}: the ncu report has no kernel with a {METRIC} value (did the NVTX filter match?)")
    return out


def parse_json(text, where="json"):
    data = json.loads(text)
    if not isinstance(data, list):
        raise ValueError(f"{where}: expected a JSON list of {{\"name\", \"us\"}}")
    return [(str(k["name"]), float(k["us"])) for k in data]


def load(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    return parse_json(text, path) if text.lstrip().startswith("[") else parse_ncu_csv(text, path)


def summarize(kernels):
    """{category: [count, us]} and {name: [count, us]}."""
    cats = {c: [0, 0.0] for c in ORDER}
    names = {}
    for name, us in kernels:
        cats[category(name)][0] += 1
        cats[category(name)][1] += us
        n = names.setdefault(name, [0, 0.0])
        n[0] += 1
        n[1] += us
    return cats, names


def short(name, width=80):
    """Kernel name for a table cell: no "void ", no parameter list, at most `width` characters, in backticks
    (template brackets would otherwise read as HTML)."""
    s = name.strip()
    if s.startswith("void "):
        s = s[5:]
    if s.endswith(")") and "(" in s:  # drop the parameter list: the last balanced (...) group
        depth = 0
        for i in range(len(s) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(s[i], 0)
            if depth == 0:
                s = s[:i] if i > 0 else s
                break
    s = s.replace("`", "'").replace("|", "\\|")
    if len(s) > width:
        s = s[:width - 3] + "..."
    return f"`{s}`"


def _pct(us, base_us):
    return f"{100.0 * us / base_us:.1f}" if base_us > 0 else "-"


def category_table(runs, gemm_tflop=0.0, gemm_peak=0.0):
    """runs: [(label, kernels, step_ms or None)] -> markdown lines."""
    head = "| category |" + "".join(f" {lab} n | {lab} ms | {lab} % |" for lab, _, _ in runs)
    lines = [head, "|---|" + "---:|---:|---:|" * len(runs)]
    stats = [(summarize(k)[0], sum(us for _, us in k), step) for _, k, step in runs]
    for cat in ORDER:
        cells = []
        for cats, total, step in stats:
            n, us = cats[cat]
            cells.append(f" {n} | {us / 1e3:.2f} | {_pct(us, step * 1e3 if step else total)} |")
        lines.append(f"| {cat} |" + "".join(cells))
    cells = [f" {sum(c[0] for c in cats.values())} | {total / 1e3:.2f} | "
             f"{_pct(total, step * 1e3 if step else total)} |" for cats, total, step in stats]
    lines.append("| **kernel sum** |" + "".join(cells))
    if any(step for _, _, step in stats):
        cells = [f" | {(step - total / 1e3):.2f} | {_pct(step * 1e3 - total, step * 1e3)} |" if step else " | - | - |"
                 for _, total, step in stats]
        lines.append("| gaps (step - kernels) |" + "".join(cells))
        cells = [f" | {step:.2f} | 100.0 |" if step else " | - | - |" for _, _, step in stats]
        lines.append("| step wall time |" + "".join(cells))
    if gemm_tflop > 0:
        parts = []
        for (lab, _, _), (cats, _, _) in zip(runs, stats):
            ms = cats["GEMM"][1] / 1e3
            if ms > 0:
                tf = gemm_tflop / (ms / 1e3)
                peak = f" = {100.0 * tf / gemm_peak:.0f}% of {gemm_peak:.0f}" if gemm_peak > 0 else ""
                parts.append(f"{lab} {tf:.0f} TFLOP/s{peak}")
        lines.append("")
        lines.append(f"GEMM work {gemm_tflop:.3f} TFLOP per step: " + "; ".join(parts))
    return lines


def top_table(label, kernels, n_top, step_ms=None):
    _, names = summarize(kernels)
    total = sum(us for _, us in kernels)
    base = step_ms * 1e3 if step_ms else total
    lines = [f"Top {n_top} kernels, {label} (% of {'step' if step_ms else 'kernel sum'}):", "",
             "| # | kernel | category | n | ms | % |", "|---:|---|---|---:|---:|---:|"]
    ranked = sorted(names.items(), key=lambda kv: -kv[1][1])[:n_top]
    for i, (name, (n, us)) in enumerate(ranked, 1):
        lines.append(f"| {i} | {short(name)} | {category(name)} | {n} | {us / 1e3:.2f} | {_pct(us, base)} |")
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("input", help="ncu CSV or kernel JSON")
    ap.add_argument("--label", default=None)
    ap.add_argument("--step-ms", type=float, default=0.0, help="wall time of the profiled step (median step)")
    ap.add_argument("--compare", default=None, help="a second input, shown side by side")
    ap.add_argument("--compare-label", default=None)
    ap.add_argument("--compare-step-ms", type=float, default=0.0)
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--gemm-tflop", type=float, default=0.0, help="GEMM work of one step in TFLOP")
    ap.add_argument("--gemm-peak", type=float, default=0.0, help="GEMM ceiling in TFLOP/s (e.g. 678)")
    a = ap.parse_args(argv)
    runs = []
    try:
        runs.append((a.label or a.input, load(a.input), a.step_ms or None))
        if a.compare:
            runs.append((a.compare_label or a.compare, load(a.compare), a.compare_step_ms or None))
    except (OSError, ValueError, KeyError) as e:
        print(f"kernel_table: {e}", file=sys.stderr)
        return 1
    out = category_table(runs, a.gemm_tflop, a.gemm_peak)
    if a.top > 0:
        for label, kernels, step in runs:
            out += [""] + top_table(label, kernels, a.top, step)
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
