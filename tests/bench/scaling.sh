#!/usr/bin/env bash
# Multi-core scaling curve (issue 11, "Scaling"): 64 B RDMA WRITE messages/s
# with N threads, each its own QP pair, over swnic (soft-RoCE) and the shm
# provider; swnic-shared puts every pair on one device pair (one lane per
# pair: core/transport/lane.h). This machine has 2 cores; the curve is run on the device
# machine (16 CPU cores), which the `run` tool reaches. Steps:
#
#   tests/bench/scaling.sh build      # bazel build, copy the static binary to .scaling/
#   tests/bench/scaling.sh local      # 1 and 2 threads here -> .scaling/local-*.json
#   # on the device machine, through the `run` tool, carry [".scaling"]:
#   #   tests/bench/scaling.sh device    (writes $OUT/{swnic,shm}-{1,2}.json, machine.txt)
#   tests/bench/scaling.sh report DIR # DIR: where $OUT came back -> docs/bench/scaling.{json,svg}
#
# Env: SECONDS_PER_POINT (3), THREADS (1,2,4,6,8,12,16), REPEATS (2).
set -euo pipefail
cd "$(dirname "$0")/../.."
secs=${SECONDS_PER_POINT:-3}
threads=${THREADS:-1,2,4,6,8,12,16}
repeats=${REPEATS:-2}
bin=.scaling/rdma_scaling_bench

case "${1:-}" in
build)
  exclude=$(git rev-parse --git-path info/exclude)  # a worktree's .git is a file
  grep -qx '/.scaling/' "$exclude" 2>/dev/null || { mkdir -p "$(dirname "$exclude")"; echo /.scaling/ >>"$exclude"; }
  bazel build //tests/bench:rdma_scaling_bench
  mkdir -p .scaling
  install -m 755 bazel-bin/tests/bench/rdma_scaling_bench "$bin"
  if ldd "$bin" >/dev/null 2>&1; then echo "warning: $bin is dynamically linked" >&2; fi
  echo "built $bin (static: the device machine's OS image differs)"
  ;;
local)
  for p in swnic swnic-shared shm; do
    "$bin" --provider "$p" --threads 1,2 --seconds "$secs" --json ".scaling/local-$p.json"
  done
  { nproc; uname -r; grep -m1 'model name' /proc/cpuinfo; cat /proc/loadavg; } >.scaling/local-machine.txt
  ;;
device)
  out=${OUT:?OUT is set by the run tool}
  { echo "nproc $(nproc)"; uname -a; grep -m1 'model name' /proc/cpuinfo; cat /proc/loadavg; lscpu 2>/dev/null | grep -E '^(Thread|Core|Socket|NUMA node\(s\))' || true; } >"$out/machine.txt"
  for r in $(seq 1 "$repeats"); do
    for p in swnic swnic-shared shm; do
      echo "== $p, round $r"
      timeout 130 "$bin" --provider "$p" --threads "$threads" --seconds "$secs" --json "$out/$p-$r.json" || echo "exit $? ($p round $r)"
      # The swnic links' segments are unlinked at close; list any left.
      ls /dev/shm | grep -c ufab-swnic-scale || true
    done
  done
  cat /proc/loadavg >>"$out/machine.txt"
  ;;
report)
  dir=${2:?report DIR}
  python3 - "$dir" <<'PY'
import glob, json, os, sys, datetime
d = sys.argv[1]
runs = {}
for f in sorted(glob.glob(os.path.join(d, "*-[0-9].json"))):
    j = json.load(open(f))
    runs.setdefault(j["provider"], []).append(j)
local = {}
for p in ("swnic", "swnic-shared", "shm"):
    f = os.path.join(".scaling", f"local-{p}.json")
    if os.path.exists(f):
        local[p] = json.load(open(f))
machine = open(os.path.join(d, "machine.txt")).read() if os.path.exists(os.path.join(d, "machine.txt")) else ""
lm = open(".scaling/local-machine.txt").read() if os.path.exists(".scaling/local-machine.txt") else ""

def med(xs):
    xs = sorted(xs); n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2

curve = {}
for p, rs in runs.items():
    pts = {}
    for r in rs:
        for pt in r["points"]:
            pts.setdefault(pt["threads"], []).append(pt)
    rows = []
    for n in sorted(pts):
        ps = pts[n]
        rates = [x["msgs_per_s"] for x in ps]
        pairs = [q for x in ps for q in x["pairs"]]
        rows.append({
            "threads": n,
            "msgs_per_s_median": med(rates), "msgs_per_s_runs": rates,
            "per_thread_min": min(q["msgs_per_s"] for q in pairs),
            "per_thread_max": max(q["msgs_per_s"] for q in pairs),
            "sender_cpu_mean": sum(q["sender_cpu"] for q in pairs) / len(pairs),
            "receiver_cpu_mean": sum(q["receiver_cpu"] for q in pairs) / len(pairs),
            "nivcsw_per_s_mean": sum(q["sender_nivcsw"] + q["receiver_nivcsw"] for q in pairs) / len(pairs) / ps[0]["elapsed_s"],
            "other_cpu_median": med([x.get("other_cpu", float("nan")) for x in ps if "other_cpu" in x] or [float("nan")]),
            "retransmits": sum(x["retransmits"] for x in ps),
        })
    curve[p] = rows
doc = {"date": datetime.date.today().isoformat(), "device_machine": machine.strip().splitlines(),
       "local_machine": lm.strip().splitlines(), "curve": curve, "device_runs": runs, "local_runs": local}
json.dump(doc, open("docs/bench/scaling.json", "w"), indent=1)

for p, rows in curve.items():
    print(f"\n{p}")
    print("| threads | msgs/s (median) | runs | per thread min–max | sender CPU | receiver CPU | other CPUs | invol. cs/s per pair |")
    print("|---:|---:|---|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['threads']} | {r['msgs_per_s_median']:,.0f} | {' / '.join(f'{x/1e6:.2f}M' for x in r['msgs_per_s_runs'])} | "
              f"{r['per_thread_min']/1e6:.2f}M–{r['per_thread_max']/1e6:.2f}M | {r['sender_cpu_mean']:.2f} | "
              f"{r['receiver_cpu_mean']:.2f} | {r['other_cpu_median']:.2f} | {r['nivcsw_per_s_mean']:,.0f} |")
for p, j in local.items():
    print(f"local {p}: " + ", ".join(f"{pt['threads']}: {pt['msgs_per_s']:,.0f}" for pt in j["points"]))

# SVG: messages/s vs threads, one line per provider (log2 x axis), plus
# this 2-core machine's points dashed.
W, H, L, R, T, B = 640, 400, 80, 150, 40, 50
allx = sorted({r["threads"] for rows in curve.values() for r in rows} | {1, 2})
ymax = max([r["msgs_per_s_median"] for rows in curve.values() for r in rows] +
           [pt["msgs_per_s"] for j in local.values() for pt in j["points"]] + [1])
import math
step = 10 ** math.floor(math.log10(ymax / 5))
for m in (1, 2, 5, 10):
    if ymax / (m * step) <= 6: step *= m; break
ytop = math.ceil(ymax / step) * step
xmax = math.log2(max(allx))
X = lambda n: L + (W - L - R) * (math.log2(n) / xmax if xmax else 0)
Y = lambda v: H - B - (H - T - B) * v / ytop
s = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
     f'<rect width="{W}" height="{H}" fill="white"/>',
     f'<text x="{W/2}" y="20" text-anchor="middle" font-size="14">64 B RDMA WRITE, N threads each with its own QP pair</text>']
v = 0
while v <= ytop + 1e-9:
    s.append(f'<line x1="{L}" x2="{W-R}" y1="{Y(v):.1f}" y2="{Y(v):.1f}" stroke="#ddd"/>')
    s.append(f'<text x="{L-6}" y="{Y(v)+4:.1f}" text-anchor="end">{v/1e6:g}M</text>')
    v += step
for n in allx:
    s.append(f'<line x1="{X(n):.1f}" x2="{X(n):.1f}" y1="{T}" y2="{H-B}" stroke="#eee"/>')
    s.append(f'<text x="{X(n):.1f}" y="{H-B+16}" text-anchor="middle">{n}</text>')
s.append(f'<text x="{(L+W-R)/2}" y="{H-12}" text-anchor="middle">threads (= QP pairs; each pair also has a receiver thread)</text>')
s.append(f'<text x="16" y="{(T+H-B)/2}" text-anchor="middle" transform="rotate(-90 16 {(T+H-B)/2})">messages/s (all threads)</text>')
colors = {"swnic": "#1f77b4", "swnic-shared": "#2ca02c", "shm": "#d62728"}
ly = T + 10
for p, rows in curve.items():
    c = colors.get(p, "black")
    pts = " ".join(f"{X(r['threads']):.1f},{Y(r['msgs_per_s_median']):.1f}" for r in rows)
    s.append(f'<polyline points="{pts}" fill="none" stroke="{c}" stroke-width="2"/>')
    for r in rows:
        s.append(f'<circle cx="{X(r["threads"]):.1f}" cy="{Y(r["msgs_per_s_median"]):.1f}" r="3" fill="{c}"/>')
    s.append(f'<line x1="{W-R+10}" x2="{W-R+30}" y1="{ly}" y2="{ly}" stroke="{c}" stroke-width="2"/><text x="{W-R+34}" y="{ly+4}">{p}, 16 cores</text>')
    ly += 18
for p, j in local.items():
    c = colors.get(p, "black")
    pts = " ".join(f"{X(pt['threads']):.1f},{Y(pt['msgs_per_s']):.1f}" for pt in j["points"])
    s.append(f'<polyline points="{pts}" fill="none" stroke="{c}" stroke-width="1.5" stroke-dasharray="5,4"/>')
    s.append(f'<line x1="{W-R+10}" x2="{W-R+30}" y1="{ly}" y2="{ly}" stroke="{c}" stroke-dasharray="5,4"/><text x="{W-R+34}" y="{ly+4}">{p}, 2 cores</text>')
    ly += 18
s.append("</svg>")
open("docs/bench/scaling.svg", "w").write("\n".join(s) + "\n")
print("wrote docs/bench/scaling.json, docs/bench/scaling.svg")
PY
  ;;
*)
  sed -n '2,14p' "$0"; exit 2 ;;
esac
