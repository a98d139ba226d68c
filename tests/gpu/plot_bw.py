#!/usr/bin/env python3
"""Draws docs/bench/gpu_write_bw.svg from perf_bench.sh's JSON files (issue 12,
docs/benchmarks.md "GPU memory"): left, write-bw against message size, host
and GPU buffers, swnic and shm; right, GPU write-bw at 16 MiB against the
staging parameters (fragment size, depth) from a --sweep run.

  tests/gpu/plot_bw.py SWNIC.json SHM.json SWEEP.json OUT.svg
"""
import json
import math
import sys


def esc(s):
    return s.replace("&", "&amp;").replace("<", "&lt;")


def size_label(n):
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def main():
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    swnic, shm, sweep = (json.load(open(p)) for p in sys.argv[1:4])
    W, H = 980, 400
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" '
           'font-family="sans-serif" font-size="12">', f'<rect width="{W}" height="{H}" fill="white"/>']

    # Left: MiB/s (log) against message size (log).
    x0, y0, w, h = 70, 40, 440, 300
    sizes = [r["size"] for r in swnic["sizes"]]
    series = [("swnic host", swnic, "host_mib_s", "#1f77b4", ""), ("swnic GPU", swnic, "gpu_mib_s", "#1f77b4", "6,4"),
              ("shm host", shm, "host_mib_s", "#d62728", ""), ("shm GPU", shm, "gpu_mib_s", "#d62728", "6,4")]
    vals = [r[k] for _, d, k, _, _ in series for r in d["sizes"] if r[k]]
    lo, hi = 10 ** math.floor(math.log10(min(vals))), 10 ** math.ceil(math.log10(max(vals)))
    xs = lambda s: x0 + w * (math.log2(s) - math.log2(sizes[0])) / (math.log2(sizes[-1]) - math.log2(sizes[0]))
    ys = lambda v: y0 + h - h * (math.log10(v) - math.log10(lo)) / (math.log10(hi) - math.log10(lo))
    out.append(f'<text x="{x0}" y="22" font-weight="bold">write-bw, two processes, host vs GPU buffers '
               f'({esc(swnic.get("gpu", ""))})</text>')
    out.append(f'<rect x="{x0}" y="{y0}" width="{w}" height="{h}" fill="none" stroke="#888"/>')
    d = lo
    while d <= hi:
        out.append(f'<line x1="{x0}" x2="{x0 + w}" y1="{ys(d):.1f}" y2="{ys(d):.1f}" stroke="#eee"/>')
        out.append(f'<text x="{x0 - 6}" y="{ys(d) + 4:.1f}" text-anchor="end">{d:g}</text>')
        d *= 10
    for s in sizes:
        out.append(f'<text x="{xs(s):.1f}" y="{y0 + h + 16}" text-anchor="middle">{size_label(s)}</text>')
    out.append(f'<text x="18" y="{y0 + h / 2}" transform="rotate(-90 18 {y0 + h / 2})" text-anchor="middle">MiB/s</text>')
    for i, (name, doc, key, color, dash) in enumerate(series):
        pts = [(xs(r["size"]), ys(r[key])) for r in doc["sizes"] if r[key]]
        path = " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
        out.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"'
                   + (f' stroke-dasharray="{dash}"' if dash else "") + "/>")
        ly = y0 + h + 36 + 0 * i
        lx = x0 + i * 110
        out.append(f'<line x1="{lx}" x2="{lx + 24}" y1="{ly}" y2="{ly}" stroke="{color}" stroke-width="2"'
                   + (f' stroke-dasharray="{dash}"' if dash else "") + "/>")
        out.append(f'<text x="{lx + 28}" y="{ly + 4}">{name}</text>')

    # Right: bars, GPU MiB/s at 16 MiB per staging parameter set.
    bx, by, bw, bh = 600, 40, 340, 300
    rows = [r for r in sweep["staging_sweep"] if r["gpu_mib_s"]]
    top = max(r["gpu_mib_s"] for r in rows) * 1.15
    out.append(f'<text x="{bx}" y="22" font-weight="bold">GPU write-bw at 16 MiB (swnic) by staging parameters</text>')
    out.append(f'<rect x="{bx}" y="{by}" width="{bw}" height="{bh}" fill="none" stroke="#888"/>')
    slot = bw / len(rows)
    for i, r in enumerate(rows):
        kv = dict(p.split("=") for p in r["params"].split(","))
        frag, depth = int(kv["gpu_frag"]), int(kv["gpu_depth"])
        bar = bh * r["gpu_mib_s"] / top
        x = bx + i * slot + slot * 0.15
        out.append(f'<rect x="{x:.1f}" y="{by + bh - bar:.1f}" width="{slot * 0.7:.1f}" height="{bar:.1f}" fill="#2ca02c"/>')
        out.append(f'<text x="{x + slot * 0.35:.1f}" y="{by + bh - bar - 4:.1f}" text-anchor="middle" font-size="10">'
                   f'{r["gpu_mib_s"]:.0f}</text>')
        out.append(f'<text x="{x + slot * 0.35:.1f}" y="{by + bh + 14}" text-anchor="middle" font-size="10">'
                   f'{size_label(frag)}</text>')
        out.append(f'<text x="{x + slot * 0.35:.1f}" y="{by + bh + 27}" text-anchor="middle" font-size="10">d{depth}</text>')
    out.append(f'<text x="{bx}" y="{by + bh + 46}" font-size="11">fragment size, depth; MiB/s, best of rounds</text>')
    out.append("</svg>")
    open(sys.argv[4], "w").write("\n".join(out) + "\n")
    print("wrote", sys.argv[4])


if __name__ == "__main__":
    main()
