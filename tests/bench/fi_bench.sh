#!/usr/bin/env bash
# Benchmark, not a test: libfabric's fi_pingpong over the ufab provider
# (libufab-fi.so) against libfabric's own shm and tcp providers, all in one
# run on this host. Prints a table and writes docs/bench/fi_pingpong.json;
# docs/benchmarks.md ("libfabric: fi_pingpong, ufab against libfabric's shm
# and tcp (host)") explains the setup and the figures.
#
#   row          provider (FI_PROVIDER / -p)   endpoint   devices
#   ufab-shm     ufab                          msg        shm:DOMAIN (both processes)
#   ufab-shm     ufab;ofi_rxm                  rdm        shm:DOMAIN
#   ufab-swnic   ufab                          msg        swnic:LINK:0@10.0.0.1 / swnic:LINK:1@10.0.0.2 (soft-RoCE)
#   ufab-swnic   ufab;ofi_rxm                  rdm        the same
#   shm          shm                           rdm        libfabric's shared-memory provider
#   tcp          tcp                           msg        -d lo (127.0.0.1), FI_TCP_IFACE=lo
#   tcp          tcp (tcp;ofi_rxm)             rdm        the same
#
# Each measurement is one fi_pingpong pair (server, then client; its own
# TCP control connection on 127.0.0.1), pinned to two different CPUs when
# the machine has two or more, with fi_pingpong's own figures: -S 8 gives
# the latency (usec/xfer: half a round trip), -S 65536 the bandwidth
# (MB/sec, 10^6 bytes per second, of the ping-pong). Every configuration
# runs once per round, rounds interleaved, and the table takes the best of
# the rounds (lowest latency, highest bandwidth) and shows the median.
# Progress is manual (fi_pingpong polls its CQs; no progress thread).
#
# Usage: tests/bench/fi_bench.sh                  (about 2 minutes after the build)
#        BENCH_QUICK=1 tests/bench/fi_bench.sh    (2 rounds, fewer iterations)
# Environment (defaults in brackets):
#   BENCH_ROUNDS      rounds [5; quick 2]
#   BENCH_LAT_ITERS   round trips per 8 B run [20000; quick 5000]
#   BENCH_BW_ITERS    round trips per 64 KiB run [5000; quick 1000]
#   BENCH_ONLY        a regular expression: only rows whose "row endpoint" matches
#   BENCH_OUT         the JSON [docs/bench/fi_pingpong.json]
#   BENCH_NO_BUILD=1  use bazel-bin/fabric/libufab-fi.so as it is
#   BENCH_PROVIDER_SO another libufab-fi.so to measure (no build; before/after comparisons)
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ "${BENCH_QUICK:-0}" = 1 ]; then
  : "${BENCH_ROUNDS:=2}" "${BENCH_LAT_ITERS:=5000}" "${BENCH_BW_ITERS:=1000}"
fi
rounds=${BENCH_ROUNDS:-5}
lat_iters=${BENCH_LAT_ITERS:-20000}
bw_iters=${BENCH_BW_ITERS:-5000}
only=${BENCH_ONLY:-}
out=${BENCH_OUT:-docs/bench/fi_pingpong.json}
so=${BENCH_PROVIDER_SO:-$PWD/bazel-bin/fabric/libufab-fi.so}
[ -n "${BENCH_PROVIDER_SO:-}" ] && BENCH_NO_BUILD=1
cmdline="tests/bench/fi_bench.sh"
[ "${BENCH_QUICK:-0}" = 1 ] && cmdline="BENCH_QUICK=1 $cmdline"

say() { printf 'fi_bench: %s\n' "$*"; }
die() { say "error: $*" >&2; exit 1; }

for t in fi_pingpong fi_info jq python3 taskset ss; do
  command -v "$t" >/dev/null || die "$t not found (libfabric-bin for fi_pingpong/fi_info; scripts/setup.sh installs them)"
done
if [ "${BENCH_NO_BUILD:-0}" != 1 ]; then
  say "building //fabric:libufab-fi.so"
  timeout 1800 bazel build //fabric:libufab-fi.so >/dev/null 2>&1 || die "build failed: bazel build //fabric:libufab-fi.so"
fi
[ -f "$so" ] || die "$so missing (bazel build //fabric:libufab-fi.so; it needs libfabric-dev)"
fi_info -p shm >/dev/null 2>&1 || die "libfabric's shm provider is not available (fi_info -p shm)"
fi_info -p tcp >/dev/null 2>&1 || die "libfabric's tcp provider is not available (fi_info -p tcp)"

w=$(mktemp -d /work/fi_bench.XXXXXX 2>/dev/null || mktemp -d)
link=fib$$
server_pid=
cleanup() {
  if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
  rm -rf "$w"
  rm -f "/dev/shm/ufab-swnic-$link"
}
trap cleanup EXIT
trap 'say "interrupted"; exit 130' INT
trap 'say "terminated"; exit 143' TERM
mkdir -p "$w/prov"
cp "$so" "$w/prov/libufab-fi.so"
export FI_PROVIDER_PATH=$w/prov
results=$w/results.jsonl
: >"$results"
t_start=$SECONDS
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
cpu_a=0
cpu_b=$(($(nproc) > 1 ? 1 : 0))
say "host: $(nproc) CPUs (server on $cpu_a, client on $cpu_b), load average $load_before, $rounds round(s)"
say "libfabric $(fi_info --version 2>/dev/null | sed -n 's/^libfabric: //p' | head -n1)"

# pair ROW EP SIZE ITERS SERVER_ENV CLIENT_ENV FI_PINGPONG_ARGS...: one
# fi_pingpong pair; appends the client's figures to $results.
pair() {
  local row=$1 ep=$2 size=$3 iters=$4 senv=$5 cenv=$6
  shift 6
  local port=$((20000 + RANDOM % 30000)) rc=0 line
  rm -f "$w/s.out" "$w/c.out" "/dev/shm/ufab-swnic-$link"
  env $senv timeout -k 5 300 taskset -c "$cpu_a" fi_pingpong -B "$port" -e "$ep" -S "$size" -I "$iters" "$@" \
    >"$w/s.out" 2>&1 &
  server_pid=$!
  for _ in $(seq 200); do
    ss -ltn 2>/dev/null | grep -q ":$port " && break
    kill -0 "$server_pid" 2>/dev/null || break
    sleep 0.05
  done
  env $cenv timeout -k 5 300 taskset -c "$cpu_b" fi_pingpong -P "$port" -e "$ep" -S "$size" -I "$iters" "$@" 127.0.0.1 \
    >"$w/c.out" 2>&1 || rc=$?
  local src=0
  wait "$server_pid" || src=$?
  [ "$rc" = 0 ] && rc=$src
  server_pid=
  # bytes #sent #ack total time MB/sec usec/xfer Mxfers/sec
  line=$(awk -v s="$size" '$1 ~ /^[0-9]/ { b = $1; if (b ~ /k$/) b = b * 1024; if (b == s) print }' "$w/c.out" | tail -n1)
  if [ "$rc" = 0 ] && [ -n "$line" ]; then
    read -r _ _ _ _ time mbs usec _ <<<"$line"
    jq -nc --arg row "$row" --arg ep "$ep" --argjson size "$size" --argjson iters "$iters" --argjson round "$round" \
      --argjson mbs "$mbs" --argjson usec "$usec" --arg time "$time" \
      '{row: $row, ep: $ep, size: $size, iters: $iters, round: $round, mb_per_sec: $mbs, usec_per_xfer: $usec,
        seconds: ($time | rtrimstr("s") | tonumber)}' >>"$results"
    say "round $round: $row -e $ep -S $size: $usec us/xfer, $mbs MB/s"
  else
    say "round $round: $row -e $ep -S $size: failed (rc $rc)"
    for f in s.out c.out; do echo "  --- $f"; tail -n 5 "$w/$f" | cut -c1-160 | sed 's/^/  | /'; done
  fi
}

shm_dev="FI_UFAB_DEVICES=shm:fib$$"
sw_srv="FI_UFAB_DEVICES=swnic:$link:0@10.0.0.1"
sw_cli="FI_UFAB_DEVICES=swnic:$link:1@10.0.0.2"
tcp_env="FI_PROVIDER=tcp FI_TCP_IFACE=lo"
# ROW|EP|SERVER ENV|CLIENT ENV|fi_pingpong options
configs="ufab-shm|msg|FI_PROVIDER=ufab $shm_dev|FI_PROVIDER=ufab $shm_dev|-p ufab
ufab-shm|rdm|FI_PROVIDER=ufab;ofi_rxm $shm_dev|FI_PROVIDER=ufab;ofi_rxm $shm_dev|
ufab-swnic|msg|FI_PROVIDER=ufab $sw_srv|FI_PROVIDER=ufab $sw_cli|-p ufab
ufab-swnic|rdm|FI_PROVIDER=ufab;ofi_rxm $sw_srv|FI_PROVIDER=ufab;ofi_rxm $sw_cli|
shm|rdm|FI_PROVIDER=shm|FI_PROVIDER=shm|-p shm
tcp|msg|$tcp_env|$tcp_env|-p tcp -d lo
tcp|rdm|$tcp_env|$tcp_env|-p tcp -d lo"

for ((round = 1; round <= rounds; round++)); do
  while IFS='|' read -r row ep senv cenv opts; do
    [ -n "$only" ] && ! [[ "$row $ep" =~ $only ]] && continue
    # shellcheck disable=SC2086 # the options are words
    pair "$row" "$ep" 8 "$lat_iters" "$senv" "$cenv" $opts
    # shellcheck disable=SC2086
    pair "$row" "$ep" 65536 "$bw_iters" "$senv" "$cenv" $opts
  done <<<"$configs"
done

# ----------------------------------------------------------------- report
mkdir -p "$(dirname "$out")"
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
git diff --quiet HEAD -- fabric drivers/shm 2>/dev/null || commit="$commit+changes"
jq -n --arg cmd "$cmdline" --arg date "$(date -u +%FT%TZ)" --arg commit "$commit" \
  --arg host "$(uname -r)" --argjson cpus "$(nproc)" --arg cpu "$(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -n1)" \
  --arg load_before "$load_before" --arg load_after "$(cut -d' ' -f1-3 /proc/loadavg)" \
  --arg libfabric "$(fi_info --version 2>/dev/null | sed -n 's/^libfabric: //p' | head -n1)" \
  --argjson rounds "$rounds" --argjson lat_iters "$lat_iters" --argjson bw_iters "$bw_iters" \
  --argjson secs $((SECONDS - t_start)) --argjson a "$cpu_a" --argjson b "$cpu_b" \
  --slurpfile runs "$results" \
  '{command: $cmd, date: $date, commit: $commit, seconds: $secs, libfabric: $libfabric,
    host: {kernel: $host, cpus: $cpus, cpu: $cpu, load_before: $load_before, load_after: $load_after,
           server_cpu: $a, client_cpu: $b},
    rounds: $rounds, iterations: {"8": $lat_iters, "65536": $bw_iters}, runs: $runs}' >"$out"
python3 - "$out" <<'PY'
import json, statistics, sys
path = sys.argv[1]
doc = json.load(open(path))
runs = doc["runs"]
order = [("ufab-shm", "msg"), ("ufab-shm", "rdm"), ("ufab-swnic", "msg"), ("ufab-swnic", "rdm"),
         ("shm", "rdm"), ("tcp", "msg"), ("tcp", "rdm")]
names = {"ufab-shm": "ufab, shm:DOMAIN", "ufab-swnic": "ufab, soft-RoCE over swnic",
         "shm": "libfabric shm", "tcp": "libfabric tcp (127.0.0.1)"}
def vals(row, ep, size, field):
    return [r[field] for r in runs if r["row"] == row and r["ep"] == ep and r["size"] == size]
table = []
for row, ep in order:
    lat = vals(row, ep, 8, "usec_per_xfer")
    bw = vals(row, ep, 65536, "mb_per_sec")
    if not lat and not bw:
        continue
    table.append({"row": row, "ep": ep, "what": names[row],
                  "lat_best_usec": min(lat) if lat else None, "lat_median_usec": statistics.median(lat) if lat else None,
                  "bw_best_mbs": max(bw) if bw else None, "bw_median_mbs": statistics.median(bw) if bw else None,
                  "rounds": [len(lat), len(bw)]})
def get(row, ep):
    return next((t for t in table if t["row"] == row and t["ep"] == ep), None)
# The goal: ufab's shared-memory device within 1.5x of libfabric shm's
# latency (8 B), and ahead of tcp (latency and bandwidth), per endpoint type.
shm = get("shm", "rdm")
goals = []
for ep in ("msg", "rdm"):
    u, t = get("ufab-shm", ep), get("tcp", ep)
    if u is None:
        continue
    g = {"ep": ep}
    if shm and u["lat_best_usec"] and shm["lat_best_usec"]:
        g["lat_vs_shm"] = u["lat_best_usec"] / shm["lat_best_usec"]
        g["lat_within_1_5x_shm"] = g["lat_vs_shm"] <= 1.5
    if t and u["lat_best_usec"] and t["lat_best_usec"]:
        g["lat_ahead_of_tcp"] = u["lat_best_usec"] < t["lat_best_usec"]
    if t and u["bw_best_mbs"] and t["bw_best_mbs"]:
        g["bw_ahead_of_tcp"] = u["bw_best_mbs"] > t["bw_best_mbs"]
    goals.append(g)
doc["table"] = table
doc["goal"] = goals
json.dump(doc, open(path, "w"), indent=1)
open(path, "a").write("\n")
def f(v, nd=2):
    return "-" if v is None else (f"{v:,.0f}" if v >= 1000 else f"{v:.{nd}f}")
print("| provider, device | endpoint | 8 B latency, best (median), us | 64 KiB bandwidth, best (median), MB/s |")
print("|---|---|---|---|")
for t in table:
    print(f"| {t['what']} | {t['ep']} | {f(t['lat_best_usec'])} ({f(t['lat_median_usec'])}) | "
          f"{f(t['bw_best_mbs'])} ({f(t['bw_median_mbs'])}) |")
for g in goals:
    parts = []
    if "lat_vs_shm" in g:
        parts.append(f"latency {g['lat_vs_shm']:.2f}x libfabric shm's ({'within' if g['lat_within_1_5x_shm'] else 'NOT within'} 1.5x)")
    if "lat_ahead_of_tcp" in g:
        parts.append(f"latency {'ahead of' if g['lat_ahead_of_tcp'] else 'NOT ahead of'} tcp {g['ep']}")
    if "bw_ahead_of_tcp" in g:
        parts.append(f"bandwidth {'ahead of' if g['bw_ahead_of_tcp'] else 'NOT ahead of'} tcp {g['ep']}")
    print(f"goal, ufab shm -e {g['ep']}: " + "; ".join(parts))
PY
say "written: $out ($((SECONDS - t_start)) s; load average $(cut -d' ' -f1-3 /proc/loadavg) after)"
