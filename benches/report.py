#!/usr/bin/env python3
"""benches/report.py — merge the benchmark CSVs of one run, check the issue 6
targets, print the table, and draw the chart.

    python3 benches/report.py --out DIR xlog_bench.csv [cudarc.csv] [w6_sim.csv]
        [--meta key=value ...] [--missing peer=reason ...]

Inputs are CSVs with the header workload,peer,param,metric,value,ratio_to_raw
(xlog_bench's, cudarc_bench's, sim_bench's). Rows without a ratio get one
where a raw row of the same workload, parameter and metric exists (the
cudarc rows come from another process of the same run).

Writes into DIR: results.csv (all rows, merged), targets.csv
(target,measured,limit,met), results.md (the tables, as BENCHMARKS.md shows
them) and chart.png (when matplotlib can be imported; otherwise a note in
results.md says why there is no chart). Prints results.md to stdout.
Exit status 0 whatever the targets say: this reports, it does not gate.
"""

import argparse
import csv
import math
import os
import sys
from collections import OrderedDict

HEADER = ["workload", "peer", "param", "metric", "value", "ratio_to_raw"]


def read_rows(path):
    rows = []
    with open(path, newline="") as f:
        for rec in csv.reader(f):
            if not rec or rec[0].startswith("#") or rec == HEADER:
                continue
            if len(rec) < 6:
                rec = rec + [""] * (6 - len(rec))
            rows.append(dict(zip(HEADER, rec[:6])))
    return rows


def as_float(text):
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


class Results:
    def __init__(self, rows):
        self.rows = rows
        self.index = {}
        for r in rows:
            self.index[(r["workload"], r["peer"], r["param"], r["metric"])] = r

    def value(self, workload, peer, param, metric):
        r = self.index.get((workload, peer, param, metric))
        return as_float(r["value"]) if r else None

    def fill_ratios(self):
        for r in self.rows:
            if r["ratio_to_raw"] or r["peer"] == "raw" or r["workload"] in ("META", "ALL", "W4", "W5", "W6", "W9", "W10"):
                continue
            v = as_float(r["value"])
            base = self.value(r["workload"], "raw", r["param"], r["metric"])
            if v is not None and base:
                r["ratio_to_raw"] = "%.4f" % (v / base)


def fmt(v, digits=3):
    if v is None:
        return "n/a"
    if abs(v) >= 100:
        return "%.1f" % v
    return ("%%.%dg" % digits) % v if abs(v) < 1 else "%.*f" % (digits - 1, v)


def check_targets(res):
    """[(target, measured text, limit text, met: True/False/None)]; None when
    a figure is missing (the target cannot be judged)."""
    out = []

    def add(name, measured, limit, met):
        out.append((name, measured, limit, met))

    for size in ("256B", "1MiB", "64MiB"):
        x = res.value("W1", "xlog", size, "us_per_pair")
        raw = res.value("W1", "raw", size, "us_per_pair")
        ratio = x / raw if x is not None and raw else None
        add("W1 %s default stack / raw" % size, fmt(ratio), "<= 1.25", None if ratio is None else ratio <= 1.25)
    for size in ("256B", "1MiB", "64MiB"):
        # Issue 24's bound, on the ratio measured in turns (xlog_bench's
        # w1_turns: both peers timed in alternation, under the same host).
        ratio = res.value("W1", "xlog", size, "ratio_to_raw_in_turns")
        add("W1 %s default stack / raw, in turns" % size, fmt(ratio), "<= 0.30", None if ratio is None else ratio <= 0.30)
    for size in ("256B", "1MiB", "64MiB"):
        d = res.value("W1", "xlog-direct", size, "us_per_pair")
        c = res.value("W1", "cudaMalloc", size, "us_per_pair")
        ratio = d / c if d is not None and c else None
        add("W1 %s Direct / cudaMalloc" % size, fmt(ratio), "<= 1.05", None if ratio is None else ratio <= 1.05)
    w2 = [r for r in res.rows if r["workload"] == "W2" and r["metric"] == "ops_per_us"]
    param = w2[0]["param"] if w2 else ""
    x = res.value("W2", "xlog", param, "ops_per_us")
    raw = res.value("W2", "raw", param, "ops_per_us")
    ratio = x / raw if x is not None and raw else None
    add("W2 ops/us default stack / raw", fmt(ratio), ">= 0.8", None if ratio is None else ratio >= 0.8)
    x = res.value("W3", "xlog", "8threads", "aggregate_ops_per_us")
    raw = res.value("W3", "raw", "8threads", "aggregate_ops_per_us")
    add("W3 8-thread aggregate ops/us, xlog vs raw", "%s vs %s" % (fmt(x), fmt(raw)), "xlog >= raw",
        None if x is None or raw is None else x >= raw)
    # Against the raw pair on fresh streams (the target), and, for
    # information, on the very streams xlog's row uses (streams that ran
    # pool allocations record and wait more slowly).
    cross = res.value("W4", "xlog", "cross-stream", "us_per_op")
    for param, label in (("record+wait", "W4 cross-stream prepare+finish / raw record+wait"),
                         ("record+wait(xlog streams)", "W4 cross-stream prepare+finish / raw record+wait on the same streams (info)")):
        rw = res.value("W4", "raw", param, "us_per_op")
        if rw is None and param != "record+wait":
            continue
        ratio = cross / rw if cross is not None and rw else None
        add(label, fmt(ratio), "<= 1.25", None if ratio is None else ratio <= 1.25)
    # Against the raw record of the fresh stream (the target), and, for
    # information, against the raw record on the stream xlog's rows use (a
    # stream that ran a pool allocation records events more slowly).
    same = res.value("W4", "xlog", "same-stream", "us_per_op")
    for param, label in (("record", "W4 same-stream prepare+finish (us) vs raw record + 0.05"),
                         ("record(xlog stream)", "W4 same-stream prepare+finish (us) vs raw record on the same stream + 0.05 (info)")):
        rec = res.value("W4", "raw", param, "us_per_op")
        if rec is None and param != "record":
            continue
        add(label, "%s vs %s" % (fmt(same), fmt(None if rec is None else rec + 0.05)), "<= record + 0.05 us",
            None if same is None or rec is None else same <= rec + 0.05)
    all8 = res.value("W4", "xlog", "prepare_all+finish_all(8)", "us_per_op")
    raw8 = res.value("W4", "raw", "8x(record+wait)", "us_per_op")
    ratio = all8 / raw8 if all8 is not None and raw8 else None
    add("W4 prepare_all/finish_all(8) / 8 raw pairs", fmt(ratio), "<= 0.35", None if ratio is None else ratio <= 0.35)
    launch = res.value("W9", "xlog", "launch", "us_per_launch")
    direct = res.value("W9", "raw", "launch", "us_per_launch")
    ratio = launch / direct if launch is not None and direct else None
    add("W9 8-block recorded launch through xlog / direct launch", fmt(ratio), "<= 1.3",
        None if ratio is None else ratio <= 1.3)
    replay = res.value("W9", "xlog", "graph", "us_per_launch")
    direct = res.value("W9", "raw", "graph", "us_per_launch")
    ratio = replay / direct if replay is not None and direct else None
    add("W9 replay of the graph captured through xlog / of the directly captured graph", fmt(ratio),
        "0.95 .. 1.05", None if ratio is None else 0.95 <= ratio <= 1.05)
    hook = res.value("W10", "xlog", "torch_malloc+torch_free", "us_per_pair")
    plain = res.value("W10", "xlog", "allocate+deallocate", "us_per_pair")
    ratio = hook / plain if hook is not None and plain else None
    add("W10 hook pair (xlog_torch_malloc/free) / xlog_allocate+deallocate", fmt(ratio), "<= 1.2",
        None if ratio is None else ratio <= 1.2)
    w5 = [r for r in res.rows if r["workload"] == "W5" and r["peer"] == "xlog-wait" and r["metric"] == "refused_needless"]
    n = as_float(w5[0]["value"]) if w5 else None
    add("W5 needless refusals, wait_on_pressure on", fmt(n), "== 0", None if n is None else n == 0)
    w6 = [r for r in res.rows if r["workload"] == "W6"]
    if w6:
        for metric, label in (("us_per_pair", "allocate+free, wall"),
                              ("cpu_us_per_pair", "allocate+free, thread CPU"),
                              ("us_per_prepare_finish_same_stream", "prepare+finish same stream, wall"),
                              ("cpu_us_per_prepare_finish_same_stream", "prepare+finish same stream, thread CPU"),
                              ("us_per_prepare_finish_cross_stream", "prepare+finish cross stream, wall"),
                              ("cpu_us_per_prepare_finish_cross_stream", "prepare+finish cross stream, thread CPU")):
            row = [r for r in w6 if r["metric"] == metric and r["ratio_to_raw"]]
            ratio = as_float(row[0]["ratio_to_raw"]) if row else None
            add("W6 (sim) %s, 1M live / 1k live" % label, fmt(ratio), "<= 1.5", None if ratio is None else ratio <= 1.5)
        row = [r for r in w6 if r["metric"] == "bytes_per_live_block_runtime" and r["param"].startswith("1M")]
        b = as_float(row[0]["value"]) if row else None
        add("W6 (sim) runtime metadata bytes per live block (1M live)", fmt(b, 4), "<= 128",
            None if b is None else b <= 128)
        row = [r for r in w6 if r["metric"] == "bytes_per_tracked_block_extra" and r["param"].startswith("1M")]
        t = as_float(row[0]["value"]) if row else None
        both = b + t if b is not None and t is not None else None
        add("W6 (sim) ... once used through prepare/finish (1M live)", fmt(both, 4), "<= 128",
            None if both is None else both <= 128)
    return out


def table(headers, lines):
    widths = [len(h) for h in headers]
    for line in lines:
        widths = [max(w, len(c)) for w, c in zip(widths, line)]
    def row(cells):
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([row(headers), sep] + [row(l) for l in lines])


def pivot(res, workload, metric, params):
    """Peers × params with value and (ratio)."""
    peers = OrderedDict()
    for r in res.rows:
        if r["workload"] == workload and r["metric"] == metric:
            peers.setdefault(r["peer"], {})[r["param"]] = r
    lines = []
    for peer, by_param in peers.items():
        cells = [peer]
        for p in params:
            r = by_param.get(p)
            if r is None:
                cells.append("")
                continue
            ratio = as_float(r["ratio_to_raw"])
            cells.append("%s (%s×)" % (fmt(as_float(r["value"])), fmt(ratio)) if ratio is not None
                         else fmt(as_float(r["value"])))
        lines.append(cells)
    return lines


def params_of(res, workload, metric):
    seen = []
    for r in res.rows:
        if r["workload"] == workload and r["metric"] == metric and r["param"] not in seen:
            seen.append(r["param"])
    return seen


def render_markdown(res, targets, chart_note):
    md = []
    meta = {r["metric"]: r["value"] for r in res.rows if r["workload"] == "META"}
    md.append("Run: " + ", ".join("%s %s" % (k, v) for k, v in meta.items()))
    md.append("")
    md.append("### Targets")
    md.append("")
    md.append(table(["target", "measured", "limit", "met"],
                    [[t, m, l, {True: "yes", False: "NO", None: "n/a"}[ok]] for t, m, l, ok in targets]))
    sections = [
        ("W1", "us_per_pair", "W1 — µs per allocate+free pair (ratio to raw)"),
        ("W2", "ops_per_us", "W2 — random replay, ops/µs (ratio to raw; higher is better)"),
        ("W3", "aggregate_ops_per_us", "W3 — replay on N threads, aggregate ops/µs (ratio to raw)"),
        ("W4", "us_per_op", "W4 — block tracking, µs per operation (ratio to its raw analogue)"),
        ("W9", "us_per_launch", "W9 — 8-block recorded launch of an empty kernel, µs per launch "
         "(xlog launch: ratio to the direct launch; xlog graph rows: ratio to the directly captured graph)"),
        ("W10", "us_per_pair", "W10 — framework hook path, µs per pair (ratio to xlog_allocate+deallocate)"),
    ]
    for workload, metric, title in sections:
        params = params_of(res, workload, metric)
        if not params:
            continue
        md.append("")
        md.append("### " + title)
        md.append("")
        md.append(table(["peer"] + params, pivot(res, workload, metric, params)))
    w5 = [r for r in res.rows if r["workload"] == "W5" and r["metric"] != "ERROR"]
    if w5:
        metrics = []
        for r in w5:
            if r["metric"] not in metrics:
                metrics.append(r["metric"])
        peers = OrderedDict()
        for r in w5:
            peers.setdefault(r["peer"], {})[r["metric"]] = r["value"]
        md.append("")
        md.append("### W5 — budget under pressure (%s)" % w5[0]["param"])
        md.append("")
        md.append(table(["peer"] + metrics, [[p] + [v.get(m, "") for m in metrics] for p, v in peers.items()]))
    w6 = params_of(res, "W6", "us_per_pair")
    if w6:
        metrics = []
        for r in res.rows:
            if r["workload"] == "W6" and r["metric"] not in metrics:
                metrics.append(r["metric"])
        lines = []
        for m in metrics:
            cells = [m]
            for p in w6:
                r = res.index.get(("W6", "xlog-sim", p, m))
                cells.append("" if r is None else (fmt(as_float(r["value"]), 4) +
                                                   (" (%s×)" % fmt(as_float(r["ratio_to_raw"])) if r["ratio_to_raw"] else "")))
            lines.append(cells)
        md.append("")
        md.append("### W6 — sim backend, scaling with live blocks (ratio to 1k live)")
        md.append("")
        md.append(table(["metric"] + w6, lines))
    bad = [r for r in res.rows if r["metric"] in ("MISSING", "ERROR", "SKIPPED")]
    if bad:
        md.append("")
        md.append("### Missing, failed or skipped")
        md.append("")
        md.append(table(["workload", "peer", "param", "what", "reason"],
                        [[r["workload"], r["peer"], r["param"], r["metric"], r["value"]] for r in bad]))
    md.append("")
    md.append(chart_note)
    return "\n".join(md) + "\n"


def draw_chart(res, path):
    """Returns a note for results.md."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:  # noqa: BLE001 - any import failure means no chart
        return "No chart: matplotlib is not importable here (%s)." % e

    fig, axes = plt.subplots(2, 2, figsize=(15, 10))

    def grouped(ax, workload, metric, title, ylabel, log=False):
        params = params_of(res, workload, metric)
        peers = []
        for r in res.rows:
            if r["workload"] == workload and r["metric"] == metric and r["peer"] not in peers:
                peers.append(r["peer"])
        if not params or not peers:
            ax.set_title(title + " (no data)")
            return
        width = 0.8 / len(peers)
        for i, peer in enumerate(peers):
            xs, ys = [], []
            for j, p in enumerate(params):
                v = res.value(workload, peer, p, metric)
                if v is not None and v > 0:
                    xs.append(j + i * width)
                    ys.append(v)
            ax.bar(xs, ys, width, label=peer)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(params))])
        ax.set_xticklabels(params)
        ax.set_title(title)
        ax.set_ylabel(ylabel)
        if log:
            ax.set_yscale("log")
        ax.legend(fontsize=7, ncol=2)
        ax.grid(axis="y", alpha=0.3)

    grouped(axes[0][0], "W1", "us_per_pair", "W1: allocate+free pair (lower is better)", "µs per pair (log)", log=True)
    grouped(axes[0][1], "W3", "aggregate_ops_per_us", "W3: random replay on N threads, one stream each (higher is better)",
            "aggregate ops/µs")
    ax = axes[1][0]
    cases = [("same stream", "record", "same-stream"), ("cross stream", "record+wait", "cross-stream"),
             ("8 blocks", "8x(record+wait)", "prepare_all+finish_all(8)")]
    for k, (peer, label) in enumerate((("raw", "raw record / record+wait / 8×"), ("xlog", "xlog prepare+finish"))):
        ys = [res.value("W4", peer, case[1 + k], "us_per_op") or 0 for case in cases]
        ax.bar([i + k * 0.4 for i in range(len(cases))], ys, 0.4, label=label)
    ax.set_xticks([i + 0.2 for i in range(len(cases))])
    ax.set_xticklabels([c[0] for c in cases])
    ax.set_ylabel("µs per operation")
    ax.set_title("W4: block tracking vs raw events (lower is better)")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    ax = axes[1][1]
    w5 = [r for r in res.rows if r["workload"] == "W5" and r["metric"] in ("refused_needless", "admitted_over_limit")]
    if w5:
        peers = []
        for r in w5:
            if r["peer"] not in peers:
                peers.append(r["peer"])
        for k, metric in enumerate(("refused_needless", "admitted_over_limit")):
            ys = [res.value("W5", p, w5[0]["param"], metric) or 0 for p in peers]
            ax.bar([i + k * 0.4 for i in range(len(peers))], ys, 0.4, label=metric)
        ax.set_xticks([i + 0.2 for i in range(len(peers))])
        ax.set_xticklabels(peers)
        ax.legend(fontsize=8)
        ax.set_title("W5: budget under pressure (counts over all rounds)")
    else:
        ax.set_title("W5 (no data)")
    meta = {r["metric"]: r["value"] for r in res.rows if r["workload"] == "META"}
    fig.suptitle("xlog-cuda vs peers — %s, driver %s, %s (medians)" % (
        meta.get("device", "?"), meta.get("driver", meta.get("driver_cuda_version", "?")), meta.get("date", "?")))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return "Chart: chart.png"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--meta", action="append", default=[], help="key=value added as a META row")
    ap.add_argument("--missing", action="append", default=[], help="peer=reason added as a MISSING row")
    ap.add_argument("csv", nargs="+")
    args = ap.parse_args()

    rows = []
    for path in args.csv:
        if os.path.exists(path):
            rows.extend(read_rows(path))
        else:
            print("report: %s does not exist" % path, file=sys.stderr)
    for kv in args.meta:
        k, _, v = kv.partition("=")
        rows.insert(0, dict(zip(HEADER, ["META", "", "", k, v.replace(",", ";"), ""])))
    for kv in args.missing:
        peer, _, reason = kv.partition("=")
        rows.append(dict(zip(HEADER, ["ALL", peer, "", "MISSING", reason.replace(",", ";"), ""])))
    res = Results(rows)
    res.fill_ratios()

    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "results.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(HEADER)
        for r in res.rows:
            w.writerow([r[h] for h in HEADER])
    targets = check_targets(res)
    with open(os.path.join(args.out, "targets.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["target", "measured", "limit", "met"])
        for t, m, l, ok in targets:
            w.writerow([t, m, l, {True: "yes", False: "no", None: "n/a"}[ok]])
    note = draw_chart(res, os.path.join(args.out, "chart.png"))
    md = render_markdown(res, targets, note)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(md)
    sys.stdout.write(md)


if __name__ == "__main__":
    main()
