#!/usr/bin/env bash
# Benchmark, not a test (issue 12, docs/benchmarks.md "GPU"): WRITE
# bandwidth with GPU buffers on both sides against host buffers on both
# sides, same provider (soft-RoCE over swnic between two `ufab perf`
# processes), same run: `ufab perf write-bw --use_cuda` beside
# `ufab perf write-bw`, 64 KiB to 64 MiB, every message's bytes checked
# (--data_validation). The figure is GPU/host of bw_avg per size (goal:
# at least 0.9 from 1 MiB up). With --sweep, also write-bw --use_cuda at
# 16 MiB for each staging parameter set given (device parameters, e.g.
# "gpu_frag=262144,gpu_depth=8"): bandwidth against fragment size and depth.
#
#   tests/gpu/perf_bench.sh UFAB_BINARY [--rounds N] [--json FILE] [--sweep "K=V,K=V K=V,..."] [--shm]
#
# --shm: the same between two processes on the shared-memory provider
# (shm:DOMAIN) instead of soft-RoCE over swnic.
#
# Prints a table and writes FILE (default docs/bench/gpu_write_bw.json).
# Each cell is the best of N rounds (default 3), host and GPU alternating.
set -euo pipefail
ufab=${1:?usage: $0 UFAB_BINARY [--rounds N] [--json FILE] [--sweep SETS]}
shift
rounds=3 json=docs/bench/gpu_write_bw.json sweep="" shm=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --rounds) rounds="$2"; shift 2 ;;
    --json) json="$2"; shift 2 ;;
    --sweep) sweep="$2"; shift 2 ;;
    --shm) shm=1; shift ;;
    *) echo "usage: $0 UFAB_BINARY [--rounds N] [--json FILE] [--sweep SETS] [--shm]" >&2; exit 2 ;;
  esac
done
command -v jq >/dev/null || { echo "perf_bench: jq is needed" >&2; exit 1; }
tmp=$(mktemp -d)
link=gb$$
server=
sdev=("swnic:$link:0" --ip 10.0.0.1) cdev=("swnic:$link:1" --ip 10.0.0.2) transport="soft-RoCE over swnic, two processes"
if [ "$shm" = 1 ]; then sdev=("shm:$link"); cdev=("shm:$link"); transport="shm provider, two processes"; fi
cleanup() {
  if [ -n "$server" ]; then kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; fi
  rm -rf "$tmp"
  rm -f /dev/shm/ufab-swnic-"$link"*
}
trap cleanup EXIT

# one SIZE "EXTRA OPTIONS": prints the client's bw_avg (MiB/s), or "err".
one() {
  local size=$1 extra=$2 port=
  # The old logs go first, so the port loop never reads the last run's port.
  rm -f /dev/shm/ufab-swnic-"$link"* "$tmp"/s.* "$tmp"/c.*
  # shellcheck disable=SC2086
  timeout 300 "$ufab" perf write-bw "${sdev[@]}" -p 0 -s "$size" -n "$iters" --data_validation \
    --json --timeout 60 $extra >"$tmp/s.out" 2>"$tmp/s.err" &
  server=$!
  for _ in $(seq 400); do
    port=$(sed -n 's/.*waiting for a client on TCP port \([0-9][0-9]*\).*/\1/p' "$tmp/s.err")
    if [ -n "$port" ] || ! kill -0 "$server" 2>/dev/null; then break; fi
    sleep 0.05
  done
  if [ -z "$port" ]; then
    wait "$server" || true; server=
    echo "perf_bench: server did not listen: $(tail -n 1 "$tmp/s.err")" >&2; echo err; return
  fi
  # shellcheck disable=SC2086
  if ! timeout 300 "$ufab" perf write-bw "${cdev[@]}" -p "$port" -s "$size" -n "$iters" \
      --data_validation --json --timeout 60 $extra 127.0.0.1 >"$tmp/c.out" 2>"$tmp/c.err"; then
    echo "perf_bench: client ($size $extra): $(tail -n 1 "$tmp/c.err")" >&2
    wait "$server" || true; server=; echo err; return
  fi
  if ! wait "$server"; then
    server=; echo "perf_bench: server ($size $extra): $(tail -n 1 "$tmp/s.err")" >&2; echo err; return
  fi
  server=
  jq -r '.results[-1].bw_avg' "$tmp/c.out"
}
best() { printf "%s\n" "$@" | { grep -v err || true; } | sort -g | tail -n 1; }

declare -A host gpu
sizes=(65536 262144 1048576 4194304 16777216 67108864)
echo "write-bw ($transport), GPU buffers (--use_cuda) vs host buffers, best of $rounds, MiB/s"
printf '%10s %12s %12s %8s\n' bytes host gpu gpu/host
rows=()
for size in "${sizes[@]}"; do
  # Enough messages for a steady state, at most about 1 GiB per run.
  iters=$(( size >= 16777216 ? 64 : size >= 1048576 ? 400 : 2000 ))
  h=() g=()
  for _ in $(seq "$rounds"); do
    h+=("$(one "$size" "")")
    g+=("$(one "$size" "--use_cuda")")
  done
  host[$size]=$(best "${h[@]}"); gpu[$size]=$(best "${g[@]}")
  ratio=$(jq -n --arg h "${host[$size]:-}" --arg g "${gpu[$size]:-}" 'if $h != "" and $g != "" and ($h|tonumber) > 0 then (($g|tonumber) / ($h|tonumber) * 1000 | round / 1000) else null end')
  printf '%10s %12s %12s %8s\n' "$size" "${host[$size]:-err}" "${gpu[$size]:-err}" "$ratio"
  rows+=("$(jq -cn --argjson s "$size" --arg h "${host[$size]:-}" --arg g "${gpu[$size]:-}" --argjson r "$ratio" \
    '{size: $s, host_mib_s: ($h | if . == "" then null else tonumber end), gpu_mib_s: ($g | if . == "" then null else tonumber end), gpu_over_host: $r}')")
done
sweeps=()
if [ -n "$sweep" ]; then
  echo "write-bw --use_cuda at 16 MiB against the staging parameters, best of $rounds, MiB/s"
  iters=64
  for set in $sweep; do
    params=""
    IFS=',' read -ra kvs <<<"$set"
    for kv in "${kvs[@]}"; do params+=" --param $kv"; done
    g=()
    for _ in $(seq "$rounds"); do g+=("$(one 16777216 "--use_cuda$params")"); done
    b=$(best "${g[@]}")
    printf '%-40s %12s\n' "$set" "${b:-err}"
    sweeps+=("$(jq -cn --arg p "$set" --arg b "${b:-}" '{params: $p, gpu_mib_s: ($b | if . == "" then null else tonumber end)}')")
  done
fi
mkdir -p "$(dirname "$json")"
jq -n --argjson rows "[$(IFS=,; echo "${rows[*]}")]" --argjson sweep "[$(IFS=,; echo "${sweeps[*]:-}")]" \
  --arg host "$(uname -n)" --arg gpu "$("$ufab" info gpu --json | jq -r '.devices[0].name // "none"')" \
  --arg transport "$transport" '{benchmark: "gpu_write_bw", transport: $transport, machine: $host, gpu: $gpu,
    units: "MiB/s (bw_avg, best of rounds)", goal: "gpu/host >= 0.9 from 1 MiB", sizes: $rows, staging_sweep: $sweep}' >"$json"
echo "wrote $json"
