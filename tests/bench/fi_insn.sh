#!/usr/bin/env bash
# Instructions per round trip of fi_pingpong (8 bytes) over ufab's shm
# device, counted by callgrind on the client (the server runs natively).
# Benchmark, not a test; docs/benchmarks.md ("fi_pingpong") has figures.
#
#   tests/bench/fi_insn.sh [--ep msg|rdm] [--n N] [--so PATH]
#
# Counted: the provider's data entry points a round trip calls, inclusive
# of everything below them (fi_send/fi_inject/fi_recv..., fi_cq_read);
# fi_pingpong's own code and, for rdm, ofi_rxm's own work are not counted.
# The client also makes empty fi_cq_read calls while the server answers,
# more or fewer from run to run (this machine is loaded). So the client
# runs twice: with T the counted instructions and C the fi_cq_read calls
# of a run, T = N * W + C * e, two runs give e (an empty poll) and W;
# printed: W + e, a round trip's work with its one fi_cq_read that found
# the message, and e. When the two runs made about as many calls (the
# solve is ill-conditioned) it runs again, at most 5 times.
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

# run ITERS: the client under callgrind, the server native; prints T and C.
run() {
  local iters=$1 port=$((20000 + RANDOM % 30000))
  rm -f "$w/cg.out"
  timeout -k 5 600 fi_pingpong "${prov[@]}" -B "$port" -e "$ep" -S 8 -I "$iters" >"$w/s.out" 2>&1 &
  server_pid=$!
  for _ in $(seq 400); do
    ss -ltn 2>/dev/null | grep -q ":$port " && break
    sleep 0.05
  done
  timeout -k 5 600 valgrind --tool=callgrind --callgrind-out-file="$w/cg.out" \
    fi_pingpong "${prov[@]}" -P "$port" -e "$ep" -S 8 -I "$iters" 127.0.0.1 >"$w/c.out" 2>&1 ||
    { cat "$w/c.out" "$w/s.out" >&2; exit 1; }
  wait "$server_pid" || { cat "$w/s.out" >&2; exit 1; }
  server_pid=
  local t c
  t=$(callgrind_annotate --threshold=100 --inclusive=yes "$w/cg.out" 2>/dev/null | grep 'libufab-fi' |
    grep -E '::(ep_(inject|injectdata|send|senddata|sendv|sendmsg|recv|recvv|recvmsg)|cq_read)\(' |
    awk '{ gsub(",", "", $1); s += $1 } END { print s + 0 }')
  # calls of cq_read: call records name a function "(id) name" the first
  # time and "(id)" after, in fn= and cfn= lines alike
  c=$(awk '/^c?fn=/ { isc = /^cfn=/; id = $1; sub(/^c?fn=/, "", id)
                      if (NF > 1) { n = $0; sub(/^c?fn=[^ ]* /, "", n); name[id] = n }
                      want = isc && name[id] ~ /::cq_read\(/; next }
           want && /^calls=/ { split($1, a, "="); s += a[2] } { want = 0 } END { print s + 0 }' "$w/cg.out")
  echo "$t $c"
}

read -r t1 c1 <<<"$(run "$n")"
for _ in 1 2 3 4 5; do
  read -r t2 c2 <<<"$(run "$n")"
  d=$((c1 > c2 ? c1 - c2 : c2 - c1))
  [ "$d" -ge $((n / 2)) ] && break
done
awk -v n="$n" -v ep="$ep" -v t1="$t1" -v c1="$c1" -v t2="$t2" -v c2="$c2" 'BEGIN {
  if (c1 == c2) { print "fi_insn: the two runs made the same number of fi_cq_read calls; run again" > "/dev/stderr"; exit 1 }
  e = (t1 - t2) / (c1 - c2); W = (t1 - c1 * e) / n
  printf "fi_insn: -e %s: %.0f instructions per round trip in the provider (an empty fi_cq_read: %.0f; runs: %d and %d reads per %d round trips)\n", ep, W + e, e, c1, c2, n
}'
