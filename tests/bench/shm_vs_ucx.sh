#!/usr/bin/env bash
# Benchmark, not a test: ufab's shared-memory RDMA provider (shm:DOMAIN,
# drivers/shm/) against UCX's shared-memory transport on this host, in one
# run. Prints a table and writes docs/bench/shm_vs_ucx.json;
# docs/benchmarks.md explains the setup and the figures.
#
# Each measurement runs a server and a client process, pinned to two
# different CPUs when the machine has two or more, the TCP exchange on
# loopback; ufab then UCX, alternating, N times; the table takes medians.
#
#   row                       ufab (`ufab perf ... shm:D`)   UCX (`ucx_perftest -x posix -d memory`)
#   8 B put/WRITE latency     write-lat -s 8, t_typical     put_lat -s 8, median
#   64 B message rate         write-bw -s 64, msg/s         put_bw -s 64, msg/s
#   64 KiB, 1 MiB bandwidth   write-bw, BW average          put_bw, overall MiB/s
#   8 B SEND latency          send-lat -s 8, t_typical      am_lat -s 8, median
#
# Both latencies are half a round trip. UCX's put is UCT's short put over
# the posix transport (a store into the peer's shared mapping), its SEND an
# active message through the posix transport's FIFO.
#
# Usage: tests/bench/shm_vs_ucx.sh                 (about 15 seconds after the build)
#        BENCH_QUICK=1 tests/bench/shm_vs_ucx.sh   (one repetition, shorter runs)
# Environment (defaults in brackets):
#   BENCH_REPEAT     repetitions of every measurement [3; quick 1]
#   BENCH_LAT_ITERS  round trips per latency run [100000; quick 20000]
#   BENCH_MR_ITERS   messages per 64 B message-rate run [2000000; quick 300000]
#   BENCH_BW_BYTES   bytes per bandwidth run [4 GiB; quick 1 GiB]
#   BENCH_OUT        the JSON [docs/bench/shm_vs_ucx.json]
#   BENCH_NO_BUILD=1 use bazel-bin/tools/ufab/ufab as it is
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/bench/ucx_pair.sh
if [ "${BENCH_QUICK:-0}" = 1 ]; then
  : "${BENCH_REPEAT:=1}" "${BENCH_LAT_ITERS:=20000}" "${BENCH_MR_ITERS:=300000}" "${BENCH_BW_BYTES:=1073741824}"
fi
repeat=${BENCH_REPEAT:-3}
lat_iters=${BENCH_LAT_ITERS:-100000}
mr_iters=${BENCH_MR_ITERS:-2000000}
bw_bytes=${BENCH_BW_BYTES:-4294967296}
out=${BENCH_OUT:-docs/bench/shm_vs_ucx.json}
ufab=$PWD/bazel-bin/tools/ufab/ufab
cmdline="tests/bench/shm_vs_ucx.sh"
[ "${BENCH_QUICK:-0}" = 1 ] && cmdline="BENCH_QUICK=1 $cmdline"

say() { printf 'shm_vs_ucx: %s\n' "$*"; }
die() { say "error: $*" >&2; exit 1; }

for t in jq python3 taskset ucx_perftest ss; do
  command -v "$t" >/dev/null || die "$t not found (scripts/setup.sh installs ucx-utils, jq)"
done
if [ "${BENCH_NO_BUILD:-0}" != 1 ]; then
  say "building //tools/ufab"
  timeout 1800 bazel build //tools/ufab >/dev/null 2>&1 || die "build failed: bazel build //tools/ufab"
fi
[ -x "$ufab" ] || die "$ufab missing (bazel build //tools/ufab)"

w=$(mktemp -d)
trap 'rm -rf "$w"' EXIT
trap 'say "interrupted"; exit 130' INT
trap 'say "terminated"; exit 143' TERM
results=$w/results.jsonl
: >"$results"
t_start=$SECONDS
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
cpu_a=0
cpu_b=$(($(nproc) > 1 ? 1 : 0))
say "host: $(nproc) CPUs (server on $cpu_a, client on $cpu_b), load average $load_before, $repeat repetition(s)"

# ufab_run ROW TEST SIZE N: `ufab perf` over shm, server first (it says
# which TCP port it took), then the client.
ufab_run() {
  local row=$1 test=$2 size=$3 n=$4 dom=bench$$_$RANDOM port='' spid rc=0 r
  rm -f "$w/s.out" "$w/s.err"
  timeout -k 5 300 taskset -c $cpu_a "$ufab" perf "$test" "shm:$dom" -s "$size" -n "$n" -p 0 --json \
    >"$w/s.out" 2>"$w/s.err" &
  spid=$!
  for _ in $(seq 300); do
    port=$(sed -n 's/^perf: waiting for a client on TCP port \([0-9]*\)$/\1/p' "$w/s.err")
    [ -n "$port" ] && break
    kill -0 "$spid" 2>/dev/null || break
    sleep 0.1
  done
  if [ -z "$port" ]; then
    say "ufab $test $size: the server did not start"; sed 's/^/  | /' "$w/s.err" | tail -n 5
    wait "$spid" || true
    return 0
  fi
  timeout -k 5 300 taskset -c $cpu_b "$ufab" perf "$test" "shm:$dom" -s "$size" -n "$n" -p "$port" --json 127.0.0.1 \
    >"$w/c.out" 2>"$w/c.err" || rc=$?
  wait "$spid" || true
  if [ "$rc" = 0 ] && r=$(jq -ce --arg row "$row" --arg t "$test" --argjson rep "$rep" '.results[0] as $r
      | {row: $row, stack: "ufab", test: $t, size: $r.size, iters: $r.iters, rep: $rep}
        + (if ($t | endswith("-lat")) then {lat_usec: $r.t_typical_usec, avg_usec: $r.t_avg_usec}
           else {bw_mib: $r.bw_avg, msg_rate: ($r.msg_rate_mpps * 1e6)} end)' "$w/c.out"); then
    echo "$r" >>"$results"
    say "ufab $test $size B x $n: $(jq -r 'if .lat_usec then "t_typical \(.lat_usec) us" else "\(.bw_mib) MiB/s, \(.msg_rate | floor) msg/s" end' <<<"$r")"
  else
    say "ufab $test $size B: failed ($rc)"; sed 's/^/  | /' "$w/c.err" | tail -n 5
  fi
}

# ucx_run ROW TEST SIZE N: one ucx_perftest measurement (ucx_pair.sh).
ucx_run() {
  local row=$1 t=$2 size=$3 n=$4 rc=0 r
  if ucx_pair "$t" "$size" "$n" 300; then
    local f=("${ucx_fields[@]}")
    r=$(jq -nc --arg row "$row" --arg t "$t" --argjson s "$size" --argjson n "$n" --argjson rep "$rep" \
      --argjson typ "${f[1]}" --argjson avg "${f[3]}" --argjson bw "${f[5]}" --argjson mr "${f[7]}" \
      '{row: $row, stack: "ucx", test: $t, size: $s, iters: $n, rep: $rep}
       + (if ($t | endswith("_lat")) then {lat_usec: $typ, avg_usec: $avg} else {bw_mib: $bw, msg_rate: $mr} end)')
    echo "$r" >>"$results"
    say "ucx $t $size B x $n: $(jq -r 'if .lat_usec then "median \(.lat_usec) us" else "\(.bw_mib) MiB/s, \(.msg_rate | floor) msg/s" end' <<<"$r")"
  else
    rc=$?
    say "ucx $t $size B: failed ($rc)"; sed 's/^/  | /' "$w/c.out" | tail -n 5
  fi
}

# ROW|UFAB TEST|UCX TEST|SIZE|ITERATIONS
rows="lat8|write-lat|put_lat|8|$lat_iters
mr64|write-bw|put_bw|64|$mr_iters
bw64k|write-bw|put_bw|65536|$((bw_bytes / 65536))
bw1m|write-bw|put_bw|1048576|$((bw_bytes / 1048576))
send8|send-lat|am_lat|8|$lat_iters"
while IFS='|' read -r row ut xt size n; do
  for ((rep = 1; rep <= repeat; rep++)); do
    ufab_run "$row" "$ut" "$size" "$n"
    ucx_run "$row" "$xt" "$size" "$n"
  done
done <<<"$rows"

# ----------------------------------------------------------------- report
mkdir -p "$(dirname "$out")"
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
git diff --quiet HEAD -- drivers/shm tools/ufab 2>/dev/null || commit="$commit+changes"
jq -n --arg cmd "$cmdline" --arg date "$(date -u +%FT%TZ)" --arg commit "$commit" \
  --arg host "$(uname -r)" --argjson cpus "$(nproc)" --arg cpu "$(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -n1)" \
  --arg load_before "$load_before" --arg load_after "$(cut -d' ' -f1-3 /proc/loadavg)" \
  --arg ucx "$(ucx_info -v 2>/dev/null | sed -n 's/^# Version //p' | head -n1)" \
  --argjson repeat "$repeat" --argjson secs $((SECONDS - t_start)) --argjson a "$cpu_a" --argjson b "$cpu_b" \
  --slurpfile runs "$results" \
  '{command: $cmd, date: $date, commit: $commit, seconds: $secs,
    host: {kernel: $host, cpus: $cpus, cpu: $cpu, load_before: $load_before, load_after: $load_after,
           server_cpu: $a, client_cpu: $b},
    ucx: $ucx, ucx_transport: "UCT posix (-x posix -d memory)", repeat: $repeat, runs: $runs}' >"$out"
python3 - "$out" <<'PY'
import json, statistics, sys
path = sys.argv[1]
doc = json.load(open(path))
# row, what, unit, field, goal (ratio bound, "le" or "ge")
rows = [
    ("lat8", "8 B put/WRITE latency", "us", "lat_usec", ("le", 1.5)),
    ("mr64", "64 B put/WRITE message rate", "msg/s", "msg_rate", None),
    ("bw64k", "64 KiB put/WRITE bandwidth", "MiB/s", "bw_mib", None),
    ("bw1m", "1 MiB put/WRITE bandwidth", "MiB/s", "bw_mib", ("ge", 0.9)),
    ("send8", "8 B SEND/AM latency", "us", "lat_usec", ("le", 1.5)),
]
def med(stack, row, field):
    v = [r[field] for r in doc["runs"] if r["stack"] == stack and r["row"] == row and r.get(field) is not None]
    return (statistics.median(v), len(v)) if v else (None, 0)
def fmt(v):
    if v is None: return "-"
    if v >= 1000: return f"{v:,.0f}"
    if v >= 10: return f"{v:.1f}"
    return f"{v:.3g}"
table = []
lines = ["| metric | ufab shm | UCX posix | ufab/UCX | goal | met |", "|---|---|---|---|---|---|"]
for row, what, unit, field, goal in rows:
    u, nu = med("ufab", row, field)
    x, nx = med("ucx", row, field)
    ratio = u / x if u is not None and x else None
    g, met = "", ""
    if goal:
        op, bound = goal
        g = f"{'<=' if op == 'le' else '>='} {bound}"
        met = "-" if ratio is None else ("met" if (ratio <= bound if op == "le" else ratio >= bound) else "no")
    table.append({"row": row, "metric": f"{what} ({unit})", "ufab": u, "ucx": x, "runs": [nu, nx],
                  "ratio": ratio, "goal": g or None, "met": met or None})
    r = "-" if ratio is None else f"{ratio:.3g}"
    lines.append(f"| {what} ({unit}) | {fmt(u)} | {fmt(x)} | {r} | {g} | {met} |")
doc["table"] = table
json.dump(doc, open(path, "w"), indent=1)
open(path, "a").write("\n")
print("\n".join(lines))
PY
say "written: $out ($((SECONDS - t_start)) s; load average $(cut -d' ' -f1-3 /proc/loadavg) after)"
