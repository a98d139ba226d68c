#!/usr/bin/env bash
# soft-RoCE over swnic against swnic itself (issue 11, host benchmarks):
# the 64 B RDMA WRITE message rate over the raw 64 B frame rate of the same
# software NIC, the 8 B SEND latency, and WRITE bandwidth with zero-copy
# transmit on and off, alternating in one run. Steps:
#
#   tests/bench/swnic_ratio.sh build        # static binaries into .bench/
#   tests/bench/swnic_ratio.sh run DIR      # ROUNDS rounds (3) -> DIR/*.json, DIR/machine.txt
#   #   on the device machine (16 CPUs) through the `run` tool, carry [".bench"]:
#   #   tests/bench/swnic_ratio.sh run $OUT
#   tests/bench/swnic_ratio.sh report DIR   # medians table -> docs/bench/swnic_ratio.json
#
# A round: swnic_bench (sender and receiver threads, 64 B frames, burst
# 32), rdma_swnic_bench (two threads, one device each), and
# rdma_swnic_bench --param zerocopy=off; then, where .bench/ufab runs (it
# links libpci and the host's libstdc++ dynamically, so not on the device
# machine), `ufab perf write-bw` over swnic between two processes at 64 KiB,
# which is to be as fast as the transport under it.
# Env: ROUNDS (3), SECONDS_PER_TEST (2).
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${ROUNDS:-3}
secs=${SECONDS_PER_TEST:-2}
dir=.bench

case "${1:-}" in
build)
  exclude=$(git rev-parse --git-path info/exclude)
  grep -qx '/.bench/' "$exclude" 2>/dev/null || { mkdir -p "$(dirname "$exclude")"; echo /.bench/ >>"$exclude"; }
  bazel build //tests/bench:rdma_swnic_bench //tests/unit/drivers/swnic:swnic_bench
  mkdir -p "$dir"
  bazel build //tools/ufab
  install -m 755 bazel-bin/tests/bench/rdma_swnic_bench bazel-bin/tests/unit/drivers/swnic/swnic_bench \
    bazel-bin/tools/ufab/ufab "$dir/"
  echo "built $dir/rdma_swnic_bench $dir/swnic_bench $dir/ufab"
  ;;
run)
  out=${2:?run DIR}
  mkdir -p "$out"
  { echo "nproc $(nproc)"; uname -r; grep -m1 'model name' /proc/cpuinfo; echo "load $(cat /proc/loadavg)"; } >"$out/machine.txt"
  for r in $(seq 1 "$rounds"); do
    echo "== round $r: swnic raw 64 B"
    timeout 120 "$dir/swnic_bench" --sizes 64 --mode threads --frames 20000000 | tee "$out/raw-$r.txt"
    echo "== round $r: soft-RoCE over swnic"
    timeout 120 "$dir/rdma_swnic_bench" --seconds "$secs" --json "$out/rdma-$r.json"
    echo "== round $r: soft-RoCE over swnic, zerocopy=off"
    timeout 120 "$dir/rdma_swnic_bench" --seconds "$secs" --param zerocopy=off --json "$out/rdma-copy-$r.json"
    if "$dir/ufab" plugins >/dev/null 2>&1; then
      echo "== round $r: ufab perf write-bw over swnic, two processes, 64 KiB"
      link="ratio$$r$r" port=$((20000 + $$ % 10000 + r))
      timeout 60 "$dir/ufab" perf write-bw "swnic:$link:0" --ip 10.0.0.1 -s 65536 -D "$secs" -p "$port" \
        --param stale=reset --json >"$out/perf-$r.json" 2>"$out/perf-server-$r.log" &
      server=$!
      sleep 1
      timeout 60 "$dir/ufab" perf write-bw "swnic:$link:1" --ip 10.0.0.2 -s 65536 -D "$secs" -p "$port" 127.0.0.1 \
        >/dev/null 2>"$out/perf-client-$r.log" || echo "ufab perf client failed (see $out/perf-client-$r.log)"
      wait "$server" || echo "ufab perf server failed (see $out/perf-server-$r.log)"
    fi
  done
  echo "load after $(cat /proc/loadavg)" >>"$out/machine.txt"
  ;;
report)
  in=${2:?report DIR}
  python3 - "$in" docs/bench/swnic_ratio.json <<'PY'
import glob, json, os, re, statistics, sys, datetime
d, out = sys.argv[1], sys.argv[2]
med = statistics.median
raw = [float(re.search(r"([\d.]+) Mframes/s", open(f).read()).group(1)) * 1e6 for f in sorted(glob.glob(f"{d}/raw-*.txt"))]
def rows(pattern):
    runs = [json.load(open(f)) for f in sorted(glob.glob(f"{d}/{pattern}"))]
    bw = {}
    for r in runs:
        for x in r["write_bw"]: bw.setdefault(x["bytes"], []).append(x)
    lat = {}
    for r in runs:
        for x in r["send_lat"]: lat.setdefault(x["bytes"], []).append(x["usec"])
    return ({b: {"mb_per_s": med([x["mb_per_s"] for x in v]), "msgs_per_s": med([x["msgs_per_s"] for x in v])} for b, v in bw.items()},
            {b: med(v) for b, v in lat.items()}, len(runs))
zc, zc_lat, n = rows("rdma-[0-9]*.json")
perf = []
for f in sorted(glob.glob(f"{d}/perf-*.json")):
    try:
        perf.append(json.load(open(f)))
    except ValueError:
        pass
cp, cp_lat, _ = rows("rdma-copy-*.json")
machine = open(f"{d}/machine.txt").read().strip()
ratio = zc[64]["msgs_per_s"] / med(raw)
res = {"description": "soft-RoCE over swnic vs swnic's raw frame rate, zero-copy on/off (tests/bench/swnic_ratio.sh)",
       "date": datetime.datetime.utcnow().strftime("%Y-%m-%dT%H:%M:%SZ"), "machine": machine, "rounds": n,
       "raw_64b_frames_per_s": med(raw), "raw_runs": raw,
       "write_bw": {str(b): v for b, v in zc.items()}, "write_bw_zerocopy_off": {str(b): v for b, v in cp.items()},
       "send_lat_usec": {str(b): v for b, v in zc_lat.items()}, "write64_over_raw": ratio, "ufab_perf_write_bw_64k": perf}
json.dump(res, open(out, "w"), indent=1)
print(f"machine: {machine.splitlines()[0]}, {n} rounds, medians")
print(f"| metric | value | goal | met |\n|---|---|---|---|")
print(f"| swnic raw 64 B frames/s | {med(raw):,.0f} | | |")
print(f"| soft-RoCE 64 B WRITE msgs/s | {zc[64]['msgs_per_s']:,.0f} | | |")
print(f"| 64 B WRITE rate / raw frame rate | {ratio:.3f} | >= 0.8 | {'yes' if ratio >= 0.8 else 'no'} |")
print(f"| 8 B SEND latency, one way (us) | {zc_lat[8]:.2f} | <= 1.1 (1/3 of 3.2-3.4) | {'yes' if zc_lat[8] <= 1.1 else 'no'} |")
print("\n| WRITE bytes | zero-copy MB/s | copy MB/s | ratio |\n|---:|---:|---:|---:|")
for b in sorted(zc):
    print(f"| {b} | {zc[b]['mb_per_s']:,.0f} | {cp[b]['mb_per_s']:,.0f} | {zc[b]['mb_per_s'] / cp[b]['mb_per_s']:.2f} |")
if perf:
    print(f"\nufab perf write-bw, 64 KiB, two processes: {len(perf)} runs (perf-*.json)")
print(f"written to {out}")
PY
  ;;
*) echo "usage: $0 build | run DIR | report DIR" >&2; exit 2 ;;
esac
