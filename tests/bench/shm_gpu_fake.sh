#!/usr/bin/env bash
# GPU memory over the shm provider, measured structurally without a GPU
# (docs/benchmarks.md, "GPU memory over shm: several work requests in
# flight"): `ufab perf write-bw` between two processes on one shm:DOMAIN
# with --use_cuda on the fake copy engine (--param gpu_copy=fake: host
# memory standing for GPU memory, copied only by the engine's thread),
# for each of the given ufab binaries (e.g. one built before a change and
# one after), and host memory with the last binary, 64 KiB to 64 MiB,
# the runs interleaved size by size so a loaded machine hurts all alike.
# Prints "SIZE LABEL MEDIAN MIN MAX" (MB/s, as `ufab perf` reports) and
# writes the same to -j FILE (default docs/bench/shm_gpu_fake.json).
#
#   tests/bench/shm_gpu_fake.sh [-r REPS] [-p KEY=VALUE]... [-j FILE] LABEL=UFAB [LABEL=UFAB...]
#
# -p passes a device parameter to both sides of every GPU run (e.g.
# gpu_fake_delay_us=10: every copy takes at least 10 us, standing for a
# copy engine's fixed cost).
set -uo pipefail
reps=3
params=()
json=docs/bench/shm_gpu_fake.json
while getopts "r:p:j:" o; do
  case $o in
    r) reps=$OPTARG ;;
    p) params+=(--param "$OPTARG") ;;
    j) json=$OPTARG ;;
    *) echo "usage: $0 [-r REPS] [-p KEY=VALUE]... [-j FILE] LABEL=UFAB..." >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[ $# -ge 1 ] || { echo "usage: $0 [-r REPS] [-p KEY=VALUE]... [-j FILE] LABEL=UFAB..." >&2; exit 2; }
command -v jq >/dev/null || { echo "$0: jq not found (scripts/setup.sh installs it)" >&2; exit 1; }
cmdline="tests/bench/shm_gpu_fake.sh $*"
tmp=$(mktemp -d)
server=
cleanup() {
  if [ -n "$server" ]; then kill "$server" 2>/dev/null; wait "$server" 2>/dev/null; fi
  rm -rf "$tmp"
}
trap cleanup EXIT

# one UFAB SIZE ITERS gpu|host: the client's bw_avg, or nothing
one() {
  local ufab=$1 size=$2 n=$3 mode=$4 port="" dom=sgf$$-$RANDOM
  local opts=(-s "$size" -n "$n" --json --timeout 20)
  [ "$mode" = gpu ] && opts+=(--use_cuda --param gpu_copy=fake "${params[@]}")
  rm -f "$tmp"/s.* "$tmp"/c.*
  timeout 120 "$ufab" perf write-bw "shm:$dom" -p 0 "${opts[@]}" >"$tmp/s.out" 2>"$tmp/s.err" &
  server=$!
  for _ in $(seq 400); do
    port=$(sed -n 's/.*waiting for a client on TCP port \([0-9][0-9]*\).*/\1/p' "$tmp/s.err" 2>/dev/null)
    if [ -n "$port" ] || ! kill -0 "$server" 2>/dev/null; then break; fi
    sleep 0.05
  done
  [ -n "$port" ] && timeout 120 "$ufab" perf write-bw "shm:$dom" -p "$port" "${opts[@]}" 127.0.0.1 \
    >"$tmp/c.out" 2>"$tmp/c.err"
  wait "$server"
  server=
  grep -o '"bw_avg":[0-9.]*' "$tmp/c.out" 2>/dev/null | tail -n 1 | cut -d: -f2
}

last=${!#}
for size in 65536 262144 1048576 4194304 16777216 67108864; do
  n=$((268435456 / size)); [ $n -lt 8 ] && n=8; [ $n -gt 2000 ] && n=2000
  declare -A got=()
  for _ in $(seq "$reps"); do
    for spec in "$@" "host=${last#*=}"; do
      label=${spec%%=*} bin=${spec#*=} mode=gpu
      [ "$label" = host ] && mode=host
      v=$(one "$bin" "$size" "$n" "$mode")
      got[$label]+="${v:-FAIL} "
    done
  done
  for spec in "$@" "host=${last#*=}"; do
    label=${spec%%=*}
    # shellcheck disable=SC2086
    line="$size $label $(printf '%s\n' ${got[$label]} | grep -v FAIL | sort -g |
      awk '{v[NR]=$1} END {if (NR == 0) print "FAIL"; else printf "%.0f %.0f %.0f", (NR % 2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2), v[1], v[NR]}')"
    echo "$line"
    echo "$line" >>"$tmp/rows"
  done
  unset got
done
mkdir -p "$(dirname "$json")"
jq -R -s --arg cmd "$cmdline" --arg date "$(date -u +%FT%TZ)" --argjson reps "$reps" \
  '{command: $cmd, date: $date, runs_per_cell: $reps, unit: "MB/s (ufab perf bw_avg)",
    rows: [split("\n")[] | select(length > 0) | split(" ") |
           {bytes: (.[0] | tonumber), label: .[1], median: (.[2] | tonumber? // null), min: (.[3] // null | tonumber? // null), max: (.[4] // null | tonumber? // null)}]}' \
  "$tmp/rows" >"$json"
echo "written: $json"
