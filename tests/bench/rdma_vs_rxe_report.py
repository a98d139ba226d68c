#!/usr/bin/env python3
"""The report of tests/bench/rdma_vs_rxe.sh: reads its JSON (the runs), adds
the headline comparisons ("summary") to it, prints them as a table, and
draws latency and bandwidth against message size as an SVG. Standard
library only.

Usage: rdma_vs_rxe_report.py RESULTS.json OUT.svg
"""
import json
import math
import re
import sys
from xml.sax.saxutils import escape

# (setup, stack) -> legend label, colour, dash pattern
SERIES = [
    (("2vm", "rxe"), "rxe \u2194 rxe (kernel soft-RoCE), 2 VMs", "#d62728", ""),
    (("2vm", "ufab"), "ufab \u2194 ufab (vfio), 2 VMs", "#1f77b4", ""),
    (("1vm", "ufab"), "ufab \u2194 ufab, 2 NICs in 1 VM", "#17becf", "6,3"),
    (("host", "swnic"), "ufab over swnic, host", "#2ca02c", ""),
    (("host", "ucx"), "UCX put, posix shm, host", "#7f7f7f", ""),
]


METRICS = ("t_typical_usec", "t_avg_usec", "p99_usec", "bw_avg_mib", "msg_rate_mpps", "frames_per_second")


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def aggregate(runs):
    """(setup, stack, test, size) -> {metric: {"median", "min", "max", "n"}}
    over the repetitions of a measurement."""
    groups = {}
    for r in runs:
        key = (r.get("setup"), r.get("stack"), r.get("test"), r.get("size"))
        for m in METRICS:
            if isinstance(r.get(m), (int, float)):
                groups.setdefault(key, {}).setdefault(m, []).append(r[m])
    return {k: {m: {"median": median(v), "min": min(v), "max": max(v), "n": len(v)} for m, v in ms.items()}
            for k, ms in groups.items()}


def value(agg, setup, stack, test, size, key, scale=1.0, what="median"):
    v = agg.get((setup, stack, test, size), {}).get(key)
    return None if v is None else v[what] * scale


def spread(agg, setup, stack, test, size, key, scale=1.0):
    v = agg.get((setup, stack, test, size), {}).get(key)
    return None if v is None else [v["min"] * scale, v["max"] * scale, v["n"]]


def summary(runs):
    agg = aggregate(runs)
    rows = []

    def add(group, metric, unit, ufab_name, ufab, peer_name, peer, goal=None, lower_better=False):
        # ufab and peer: (setup, stack, test, size, key, scale)
        ufab_range, peer_range = spread(agg, *ufab), spread(agg, *peer)
        ufab, peer = value(agg, *ufab), value(agg, *peer)
        ratio = ufab / peer if ufab is not None and peer not in (None, 0) else None
        met = None
        if goal is not None and ratio is not None:
            met = ratio <= goal if lower_better else ratio >= goal
        rows.append({
            "group": group, "metric": metric, "unit": unit,
            "ufab_name": ufab_name, "ufab": ufab, "ufab_min_max_n": ufab_range,
            "peer_name": peer_name, "peer": peer, "peer_min_max_n": peer_range,
            "ratio": ratio, "goal": (("<= " if lower_better else ">= ") + format(goal, "g")) if goal is not None else None,
            "met": met,
        })

    vm = "2 VMs, e1000e"
    add(vm, "8-byte WRITE latency, t_typical", "us",
        "ufab", ("2vm", "ufab", "write-lat", 8, "t_typical_usec"),
        "rxe", ("2vm", "rxe", "write-lat", 8, "t_typical_usec"), goal=0.1, lower_better=True)
    add(vm, "64-byte WRITE message rate", "msg/s",
        "ufab", ("2vm", "ufab", "write-bw", 64, "msg_rate_mpps", 1e6),
        "rxe", ("2vm", "rxe", "write-bw", 64, "msg_rate_mpps", 1e6), goal=10)
    add(vm, "64 KiB WRITE bandwidth", "MiB/s",
        "ufab", ("2vm", "ufab", "write-bw", 65536, "bw_avg_mib"),
        "rxe", ("2vm", "rxe", "write-bw", 65536, "bw_avg_mib"))
    raw = ("1vm", "ufab-pktgen", "raw-frames", 138, "frames_per_second")
    add(vm, "64-byte WRITE rate / raw 138-byte frame rate", "msg/s vs frames/s",
        "ufab, 2 VMs", ("2vm", "ufab", "write-bw", 64, "msg_rate_mpps", 1e6), "pktgen, 1 VM", raw, goal=0.8)
    add("1 VM, e1000e", "64-byte WRITE rate / raw 138-byte frame rate", "msg/s vs frames/s",
        "ufab, 1 VM", ("1vm", "ufab", "write-bw", 64, "msg_rate_mpps", 1e6), "pktgen, 1 VM", raw, goal=0.8)
    add("1 VM, e1000e", "8-byte WRITE latency, t_typical", "us",
        "ufab, 1 VM", ("1vm", "ufab", "write-lat", 8, "t_typical_usec"),
        "ufab, 2 VMs", ("2vm", "ufab", "write-lat", 8, "t_typical_usec"))
    host = "host"
    add(host, "8-byte put/WRITE latency, median", "us",
        "swnic", ("host", "swnic", "write-lat", 8, "t_typical_usec"),
        "UCX posix", ("host", "ucx", "write-lat", 8, "t_typical_usec"))
    add(host, "64-byte put/WRITE message rate", "msg/s",
        "swnic", ("host", "swnic", "write-bw", 64, "msg_rate_mpps", 1e6),
        "UCX posix", ("host", "ucx", "write-bw", 64, "msg_rate_mpps", 1e6))
    return rows


def fmt(v):
    if v is None:
        return "n/a"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    if abs(v) >= 0.1:
        return f"{v:.2f}"
    return f"{v:.3g}"


def rng(mmn):
    if not mmn or mmn[2] < 2:
        return ""
    return f" ({fmt(mmn[0])}..{fmt(mmn[1])})"


def table(rows):
    head = ["setup", "metric", "ufab side", "peer", "ufab/peer", "goal", "met"]
    body = []
    for r in rows:
        met = {True: "yes", False: "NO", None: "-"}[r["met"]]
        body.append([
            r["group"], f'{r["metric"]} ({r["unit"]})',
            f'{r["ufab_name"]} {fmt(r["ufab"])}{rng(r["ufab_min_max_n"])}',
            f'{r["peer_name"]} {fmt(r["peer"])}{rng(r["peer_min_max_n"])}',
            fmt(r["ratio"]), r["goal"] or "-", met,
        ])
    widths = [max(len(x[i]) for x in [head] + body) for i in range(len(head))]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()
    print(line(head))
    print(line(["-" * w for w in widths]))
    for b in body:
        print(line(b))


# ------------------------------------------------------------------- SVG
def size_label(s):
    if s >= 1 << 20:
        return f"{s >> 20}M"
    if s >= 1 << 10:
        return f"{s >> 10}K"
    return str(s)


def panel(out, x0, y0, w, h, title, ylabel, points, sizes):
    """points: list of (label, colour, dash, [(size, median, min, max)])"""
    vals = [v for _, _, _, pts in points for p in pts for v in p[1:] if v and v > 0]
    if not sizes:
        sizes = sorted({p[0] for _, _, _, pts in points for p in pts})
    out.append(f'<text x="{x0 + w / 2}" y="{y0 - 12}" text-anchor="middle" font-size="14" font-weight="bold">{escape(title)}</text>')
    out.append(f'<rect x="{x0}" y="{y0}" width="{w}" height="{h}" fill="none" stroke="#333"/>')
    if not vals or not sizes:
        out.append(f'<text x="{x0 + w / 2}" y="{y0 + h / 2}" text-anchor="middle">no data</text>')
        return
    lx0, lx1 = math.log2(min(sizes)), math.log2(max(sizes))
    if lx1 == lx0:
        lx0, lx1 = lx0 - 1, lx1 + 1
    ly0, ly1 = math.floor(math.log10(min(vals))), math.ceil(math.log10(max(vals)))
    if ly1 == ly0:
        ly1 += 1
    px = lambda s: x0 + 10 + (math.log2(s) - lx0) / (lx1 - lx0) * (w - 20)
    py = lambda v: y0 + h - (math.log10(v) - ly0) / (ly1 - ly0) * h
    for d in range(ly0, ly1 + 1):
        y = py(10 ** d)
        out.append(f'<line x1="{x0}" y1="{y:.1f}" x2="{x0 + w}" y2="{y:.1f}" stroke="#ddd"/>')
        label = f"{10 ** d:g}" if -3 <= d <= 6 else f"1e{d}"
        out.append(f'<text x="{x0 - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="11">{label}</text>')
        for m in range(2, 10):
            if d < ly1:
                ym = py(m * 10 ** d)
                out.append(f'<line x1="{x0}" y1="{ym:.1f}" x2="{x0 + 4}" y2="{ym:.1f}" stroke="#999"/>')
    for s in sizes:
        x = px(s)
        out.append(f'<line x1="{x:.1f}" y1="{y0}" x2="{x:.1f}" y2="{y0 + h}" stroke="#eee"/>')
        out.append(f'<text x="{x:.1f}" y="{y0 + h + 16}" text-anchor="middle" font-size="11">{size_label(s)}</text>')
    out.append(f'<text x="{x0 + w / 2}" y="{y0 + h + 34}" text-anchor="middle" font-size="12">message size (bytes)</text>')
    out.append(f'<text x="{x0 - 48}" y="{y0 + h / 2}" text-anchor="middle" font-size="12" '
               f'transform="rotate(-90 {x0 - 48} {y0 + h / 2})">{escape(ylabel)}</text>')
    for _, colour, dash, pts in points:
        pts = [p for p in sorted(pts) if p[1] and p[1] > 0]
        if not pts:
            continue
        path = " ".join(f"{px(s):.1f},{py(v):.1f}" for s, v, _, _ in pts)
        da = f' stroke-dasharray="{dash}"' if dash else ""
        out.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"{da}/>')
        for s, v, lo, hi in pts:
            x = px(s)
            if lo and hi and lo > 0 and hi > lo:  # the spread of the repetitions
                out.append(f'<line x1="{x:.1f}" y1="{py(lo):.1f}" x2="{x:.1f}" y2="{py(hi):.1f}" stroke="{colour}"/>')
                for b in (lo, hi):
                    out.append(f'<line x1="{x - 3:.1f}" y1="{py(b):.1f}" x2="{x + 3:.1f}" y2="{py(b):.1f}" stroke="{colour}"/>')
            out.append(f'<circle cx="{x:.1f}" cy="{py(v):.1f}" r="3" fill="{colour}"/>')


def svg(doc, path):
    agg = aggregate(doc["runs"])
    lat, bw = [], []

    def series(setup, stack, test, key):
        return [(k[3], v[key]["median"], v[key]["min"], v[key]["max"]) for k, v in sorted(agg.items())
                if k[:3] == (setup, stack, test) and key in v]

    for (setup, stack), label, colour, dash in SERIES:
        lat.append((label, colour, dash, series(setup, stack, "write-lat", "t_typical_usec")))
        bw.append((label, colour, dash, series(setup, stack, "write-bw", "bw_avg_mib")))
    W, H = 1000, 470
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" '
           'font-family="DejaVu Sans, Arial, sans-serif">',
           f'<rect width="{W}" height="{H}" fill="white"/>']
    sizes = doc.get("sizes", {})
    panel(out, 80, 40, 380, 300, "RDMA WRITE latency (t_typical, half round trip)", "microseconds (log)", lat,
          sorted(sizes.get("latency", [])))
    panel(out, 590, 40, 380, 300, "RDMA WRITE bandwidth (BW average)", "MiB/s (log)", bw,
          sorted(sizes.get("bandwidth", [])))
    y = 400
    for i, (_, label, colour, dash) in enumerate(SERIES):
        x = 80 + (i % 3) * 310
        yy = y + (i // 3) * 20
        da = f' stroke-dasharray="{dash}"' if dash else ""
        out.append(f'<line x1="{x}" y1="{yy}" x2="{x + 26}" y2="{yy}" stroke="{colour}" stroke-width="2"{da}/>')
        out.append(f'<text x="{x + 32}" y="{yy + 4}" font-size="12">{escape(label)}</text>')
    m = re.search(r"version (\S+)", doc.get("qemu", ""))
    note = (f'{doc.get("date", "")[:10]}; QEMU {m.group(1) if m else "?"} (TCG), e1000e; '
            f'host {doc.get("host", {}).get("cpus", "?")} CPUs; {doc.get("command", "")}')
    out.append(f'<text x="{W - 10}" y="{H - 8}" text-anchor="end" font-size="10" fill="#666">{escape(note)}</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def dumps(doc):
    """JSON with one run or summary row per line."""
    parts = []
    for k, v in doc.items():
        if isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            body = ",\n".join("  " + json.dumps(x) for x in v)
            parts.append(f" {json.dumps(k)}: [\n{body}\n ]")
        else:
            parts.append(f" {json.dumps(k)}: {json.dumps(v)}")
    return "{\n" + ",\n".join(parts) + "\n}\n"


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    with open(sys.argv[1]) as f:
        doc = json.load(f)
    doc["summary"] = summary(doc["runs"])
    with open(sys.argv[1], "w") as f:
        f.write(dumps(doc))
    print()
    table(doc["summary"])
    print()
    svg(doc, sys.argv[2])


if __name__ == "__main__":
    main()
