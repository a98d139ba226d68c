#!/usr/bin/env bash
# Instructions per round trip of fi_pingpong (8 bytes) over ufab's shm
# device, counted by callgrind: one side runs under valgrind, its peer runs
# natively, so the measured side finds each message already there (almost
# no empty polls) and the count is the work of one round trip: posting the
# send and the receive, progress, the completion.
# Benchmark, not a test; docs/benchmarks.md ("fi_pingpong") has figures.
#
#   tests/bench/fi_insn.sh [--ep msg|rdm] [--n N] [--so PATH]
#
# Only the client is measured: the server under valgrind polls its CQ
# while the native client starts, a number of empty polls that varies from
# run to run; the two sides do the same work per round trip.
#
# Counted: what runs inside the provider's entry points that a round trip
# calls (fi_send/fi_inject/fi_recv and fi_cq_read: callgrind's
# --toggle-collect on ep_* and cq_read*), fi_pingpong's own code and, for
# rdm, ofi_rxm's not included. Start-up is taken out by measuring N and 2N
# iterations and taking the difference. Prints the instructions per round
# trip. The count moves by a few instructions from run to run (an empty
# poll now and then).
set -euo pipefail
cd "$(dirname "$0")/../.."
ep=msg
n=2000
so=$PWD/bazel-bin/fabric/libufab-fi.so
while [[ $# -gt 0 ]]; do
  case "$1" in
    --ep) ep="$2"; shift 2 ;;
    --n) n="$2"; shift 2 ;;
    --so) so="$2"; shift 2 ;;
    *) echo "usage: $0 [--ep msg|rdm] [--n N] [--so PATH]" >&2; exit 2 ;;
  esac
done
for t in valgrind callgrind_annotate fi_pingpong ss; do
  command -v "$t" >/dev/null || { echo "fi_insn.sh: $t not found" >&2; exit 1; }
done
[ -f "$so" ] || { echo "fi_insn.sh: $so missing (bazel build //fabric:libufab-fi.so)" >&2; exit 1; }
w=$(mktemp -d /work/fi_insn.XXXXXX)
server_pid=
cleanup() {
  if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
  rm -rf "$w"
}
trap cleanup EXIT
mkdir -p "$w/prov"
cp "$so" "$w/prov/libufab-fi.so"
export FI_PROVIDER_PATH=$w/prov FI_UFAB_DEVICES=shm:insn$$
if [ "$ep" = rdm ]; then export FI_PROVIDER="ufab;ofi_rxm"; prov=(); else prov=(-p ufab); fi

# run SIDE ITERS: SIDE (client or server) under callgrind, the other native;
# prints the measured side's instructions inside the provider.
run() {
  local side=$1 iters=$2 port=$((20000 + RANDOM % 30000)) vg=(valgrind --tool=callgrind --callgrind-out-file="$w/cg.out"
    --toggle-collect='ufab_fi::*::ep_*' --toggle-collect='ufab_fi::*::cq_read*')
  local sv=() cv=()
  if [ "$side" = server ]; then sv=("${vg[@]}"); else cv=("${vg[@]}"); fi
  rm -f "$w/cg.out"
  timeout -k 5 600 "${sv[@]}" fi_pingpong "${prov[@]}" -B "$port" -e "$ep" -S 8 -I "$iters" >"$w/s.out" 2>&1 &
  server_pid=$!
  for _ in $(seq 400); do
    ss -ltn 2>/dev/null | grep -q ":$port " && break
    sleep 0.05
  done
  timeout -k 5 600 "${cv[@]}" fi_pingpong "${prov[@]}" -P "$port" -e "$ep" -S 8 -I "$iters" 127.0.0.1 >"$w/c.out" 2>&1 ||
    { cat "$w/c.out" "$w/s.out" >&2; exit 1; }
  wait "$server_pid" || { cat "$w/s.out" >&2; exit 1; }
  server_pid=
  local total
  total=$(sed -n 's/^summary: //p' "$w/cg.out")
  echo "$total"
}

t1=$(run client "$n")
t2=$(run client $((2 * n)))
echo "fi_insn: -e $ep, client measured: $(((t2 - t1) / n)) instructions per round trip in the provider"
