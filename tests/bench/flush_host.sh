#!/usr/bin/env bash
# Benchmark, not a test: what a commit costs. On this host, over swnic
# between two `ufab perf` processes, write-lat and write-bw at 64 B, 4 KiB
# and 64 KiB, three ways each:
#   plain        the WRITE alone (perftest's tests)
#   global       --flush global: a FLUSH GLOBAL of each WRITE's range behind
#                it; a message is done when the FLUSH completes (visible)
#   persistent   --flush persistent with --pmem files on a disk: the FLUSH
#                is answered once msync(MS_SYNC) of the range returned
#                (durable)
# The figure is the ratio to plain: latency (t_typical, half a round trip)
# flush / plain, bandwidth (bw_avg) flush / plain, of the medians over the
# rounds and of the best round (least latency, most bandwidth): on a shared
# host the two processes sometimes share a core with others, which moves a
# ping-pong's figures from microseconds to a scheduler's time slice; the
# best round is the run that had its cores. Prints a table and writes
# docs/bench/flush_host.json (or --json FILE).
#
#   tests/bench/flush_host.sh [--rounds N] [--seconds S] [--iters N] [--pmem-dir DIR] [--json FILE]
#
# --rounds (3): each cell is the median of N runs, the three ways
# alternating within a round. --seconds (3): write-bw runs -D S (S/4
# warm-up and tail). --iters (2000): write-lat's -n. --pmem-dir (.bench/
# under the repository, i.e. the /work disk here): where the --pmem files
# go; it must be a disk file system (not tmpfs), since a FLUSH PERSISTENT
# needs durable memory. A way that fails (a provider without durable
# memory refuses --pmem) is recorded with its error and shown as n/a.
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=3 secs=3 iters=2000 pmem_dir=.bench json=docs/bench/flush_host.json
while [[ $# -gt 0 ]]; do
  case "$1" in
    --rounds) rounds="$2"; shift 2 ;;
    --seconds) secs="$2"; shift 2 ;;
    --iters) iters="$2"; shift 2 ;;
    --pmem-dir) pmem_dir="$2"; shift 2 ;;
    --json) json="$2"; shift 2 ;;
    *) echo "usage: $0 [--rounds N] [--seconds S] [--iters N] [--pmem-dir DIR] [--json FILE]" >&2; exit 2 ;;
  esac
done
command -v jq >/dev/null || { echo "flush_host: jq is needed" >&2; exit 1; }
bazel build //tools/ufab >/dev/null 2>&1 || { echo "flush_host: build failed: bazel build //tools/ufab" >&2; exit 1; }
mkdir -p "$pmem_dir" "$(dirname "$json")"
fstype=$(stat -f -c %T "$pmem_dir")
if [ "$fstype" = tmpfs ]; then
  echo "flush_host: $pmem_dir is on tmpfs, which no FLUSH makes durable; give --pmem-dir on a disk" >&2
  exit 1
fi
# A private copy of the binary: a rebuild meanwhile does not change it.
tmp=$(mktemp -d)
ufab="$tmp/ufab"
cp bazel-bin/tools/ufab/ufab "$ufab"
link=fh$$
server=
cleanup() {
  if [ -n "$server" ]; then kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; fi
  rm -rf "$tmp"
  rm -f /dev/shm/ufab-swnic-"$link"* "$pmem_dir"/flush-"$link".*
}
trap cleanup EXIT

# One measurement: TEST SIZE WAY ROUND; prints the client's JSON (or an
# {"ok": false, "error": ...} object).
measure() {
  local test=$1 size=$2 way=$3 r=$4 sopts=() copts=()
  local n="$link$r${test//-/}$size$way"
  local opts=(-s "$size")
  if [ "$test" = write-lat ]; then opts+=(-n "$iters"); else opts+=(-D "$secs"); fi
  case $way in
    global) sopts=(--flush global); copts=(--flush global) ;;
    persistent)
      sopts=(--flush persistent --pmem "$pmem_dir/flush-$link.server")
      copts=(--flush persistent)
      # write-lat: the server flushes the client's buffer too.
      [ "$test" = write-lat ] && copts+=(--pmem "$pmem_dir/flush-$link.client")
      ;;
  esac
  rm -f "$tmp/server.err"  # else the wait below may read the last run's port
  timeout 120 "$ufab" perf "$test" "swnic:$n:0" --ip 10.0.0.1 -p 0 --json --timeout 20 "${opts[@]}" "${sopts[@]}" \
    >"$tmp/server.out" 2>"$tmp/server.err" &
  server=$!
  local port=
  for _ in $(seq 400); do
    port=$(sed -n 's/.*waiting for a client on TCP port \([0-9][0-9]*\).*/\1/p' "$tmp/server.err" 2>/dev/null)
    if [ -n "$port" ] || ! kill -0 "$server" 2>/dev/null; then break; fi
    sleep 0.05
  done
  if [ -z "$port" ]; then
    wait "$server" || true
    server=
    jq -nc --arg e "$(grep 'ufab perf:' "$tmp/server.err" | tail -n 1)" '{ok: false, error: ("server: " + $e)}'
    rm -f /dev/shm/ufab-swnic-"$n"*
    return
  fi
  if timeout 120 "$ufab" perf "$test" "swnic:$n:1" --ip 10.0.0.2 -p "$port" --json --timeout 20 "${opts[@]}" "${copts[@]}" \
    127.0.0.1 >"$tmp/client.out" 2>"$tmp/client.err"; then
    cat "$tmp/client.out"
  else
    jq -nc --arg e "$(grep 'ufab perf:' "$tmp/client.err" | tail -n 1)" '{ok: false, error: ("client: " + $e)}'
  fi
  wait "$server" || true
  server=
  rm -f /dev/shm/ufab-swnic-"$n"*
}

{ echo "nproc $(nproc)"; uname -r; grep -m1 'model name' /proc/cpuinfo; echo "load before $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "pmem dir $(realpath "$pmem_dir") ($fstype on $(df --output=source "$pmem_dir" | tail -n 1))"; } >"$tmp/machine.txt"
: >"$tmp/runs.jsonl"
for r in $(seq 1 "$rounds"); do
  for test in write-lat write-bw; do
    for size in 64 4096 65536; do
      for way in plain global persistent; do
        out=$(measure "$test" "$size" "$way" "$r")
        jq -c --arg test "$test" --argjson size "$size" --arg way "$way" --argjson round "$r" \
          '{test: $test, size: $size, way: $way, round: $round, ok: .ok, error: .error,
            t_typical_usec: .results[0].t_typical_usec, bw_avg: .results[0].bw_avg, msg_rate_mpps: .results[0].msg_rate_mpps}' \
          <<<"$out" >>"$tmp/runs.jsonl"
        echo "round $r: $test $size B $way: $(tail -n 1 "$tmp/runs.jsonl" | jq -r 'if .ok then (if .t_typical_usec then "\(.t_typical_usec) us" else "\(.bw_avg) MiB/s" end) else .error end')" >&2
      done
    done
  done
done
echo "load after $(cut -d' ' -f1-3 /proc/loadavg)" >>"$tmp/machine.txt"

jq -s --arg cmd "tests/bench/flush_host.sh --rounds $rounds --seconds $secs --iters $iters" \
  --arg date "$(date -u +%FT%TZ)" --arg machine "$(cat "$tmp/machine.txt")" '
  def median: sort | if length == 0 then null elif length % 2 == 1 then .[length / 2 | floor] else (.[length / 2 - 1] + .[length / 2]) / 2 end;
  def ratio(a; b): if a and b then a / b else null end;
  . as $runs
  | [group_by([.test, .size, .way])[]
     | (.[0].test == "write-lat") as $lat
     | (map(select(.ok) | if $lat then .t_typical_usec else .bw_avg end)) as $v
     | {test: .[0].test, size: .[0].size, way: .[0].way, runs: length, ok: ($v | length),
        error: (map(select(.ok | not) | .error) | first),
        median: ($v | median), best: (if ($v | length) == 0 then null elif $lat then ($v | min) else ($v | max) end)}] as $cells
  | {description: "write-lat (t_typical, usec) and write-bw (bw_avg, MiB/s) over swnic between two ufab perf processes: plain, --flush global, --flush persistent with --pmem files (msync); ratios flush / plain of the medians and of the best rounds",
     command: $cmd, date: $date, machine: $machine, rounds: ($runs | map(.round) | max),
     cells: $cells,
     table: [$cells | group_by([.test, .size])[]
       | (map({key: .way, value: .}) | from_entries) as $w
       | {test: .[0].test, size: .[0].size,
          plain: $w.plain.median, global: $w.global.median, persistent: $w.persistent.median,
          plain_best: $w.plain.best, global_best: $w.global.best, persistent_best: $w.persistent.best,
          persistent_error: (if $w.persistent.ok == 0 then $w.persistent.error else null end)}
       | . + {global_ratio: ratio(.global; .plain), persistent_ratio: ratio(.persistent; .plain),
              global_ratio_best: ratio(.global_best; .plain_best), persistent_ratio_best: ratio(.persistent_best; .plain_best)}],
     runs: $runs}' "$tmp/runs.jsonl" >"$json"

echo
jq -r '.machine' "$json" | sed -n '1p;3,4p'
printf '%-9s %6s %16s %16s %16s %15s %15s\n' test bytes "plain (best)" "global (best)" "persist. (best)" "glob/pl (best)" "pers/pl (best)"
jq -r 'def f(d): if . == null then "n/a" else (. * d | round / d | tostring) end;
  .table | sort_by(.test, .size)[] | [.test, .size,
    "\(.plain | f(100)) (\(.plain_best | f(100)))", "\(.global | f(100)) (\(.global_best | f(100)))",
    "\(.persistent | f(100)) (\(.persistent_best | f(100)))",
    "\(.global_ratio | f(1000)) (\(.global_ratio_best | f(1000)))", "\(.persistent_ratio | f(1000)) (\(.persistent_ratio_best | f(1000)))"] | @tsv' "$json" |
  while IFS=$'\t' read -r t s p g q gr qr; do printf '%-9s %6s %16s %16s %16s %15s %15s\n' "$t" "$s" "$p" "$g" "$q" "$gr" "$qr"; done
echo "(medians over the rounds, the best round in parentheses; write-lat: t_typical usec, half a round trip;"
echo " write-bw: bw_avg MiB/s; ratio: flush / plain)"
jq -r '[.table[] | select(.persistent_error) | .persistent_error] | unique[] | "persistent n/a: " + .' "$json"
echo "written: $json"
