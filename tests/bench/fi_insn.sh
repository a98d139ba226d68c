#!/usr/bin/env bash
# Instructions per round trip of fi_pingpong's 8-byte exchange over ufab's
# shm device (-e msg), counted by callgrind. Benchmark, not a test;
# docs/benchmarks.md ("fi_pingpong") has the figures.
#
#   tests/bench/fi_insn.sh [--n N] [--so PATH]...
#
# tests/bench/fi_insn_bench.cc runs both ends in one thread over one shm
# device through the libfabric API and ufab's provider (a receive posted,
# fi_inject, fi_cq_read on the receive CQ until the message is there, on
# each side, as fi_pingpong does): every message is in the peer's ring when
# the peer reads, so no read comes back empty and the count does not depend
# on timing (on this loaded machine two processes would poll each other an
# unpredictable number of times). Counted: everything inside the N
# measured round trips (callgrind --toggle-collect=insn_measured), both
# sides, the provider, libfabric's inline wrappers and libc included.
# Also per round trip: mutex acquisitions (pthread_mutex_lock and trylock
# calls: each is an atomic read-modify-write) and system calls.
#
# --so takes a libufab-fi.so to measure (default: bazel-bin's, built
# here); give it several times to compare builds (before/after). --json
# FILE (default docs/bench/fi_insn.json) gets the same figures.
set -euo pipefail
cd "$(dirname "$0")/../.."
n=20000
sos=()
json=docs/bench/fi_insn.json
while [[ $# -gt 0 ]]; do
  case "$1" in
    --n) n="$2"; shift 2 ;;
    --so) sos+=("$2"); shift 2 ;;
    --json) json="$2"; shift 2 ;;
    *) echo "usage: $0 [--n N] [--so PATH]... [--json FILE]" >&2; exit 2 ;;
  esac
done
for t in valgrind callgrind_annotate jq; do
  command -v "$t" >/dev/null || { echo "fi_insn.sh: $t not found" >&2; exit 1; }
done
if [ ${#sos[@]} = 0 ]; then
  timeout 1800 bazel build //fabric:libufab-fi.so >/dev/null 2>&1 || { echo "fi_insn.sh: bazel build //fabric:libufab-fi.so failed" >&2; exit 1; }
  sos=("$PWD/bazel-bin/fabric/libufab-fi.so")
fi
timeout 1800 bazel build //tests/bench:fi_insn_bench >/dev/null 2>&1 || { echo "fi_insn.sh: bazel build //tests/bench:fi_insn_bench failed" >&2; exit 1; }
bin=$PWD/bazel-bin/tests/bench/fi_insn_bench
[ -x "$bin" ] || { echo "fi_insn.sh: $bin missing (libfabric's headers are needed)" >&2; exit 1; }
w=$(mktemp -d /work/fi_insn.XXXXXX)
trap 'rm -rf "$w"' EXIT

# calls FILE REGEX: calls to functions whose name matches, from the call
# records (a function is "(id) name" the first time, "(id)" after).
calls() {
  awk -v re="$2" '/^c?fn=/ { isc = /^cfn=/; id = $1; sub(/^c?fn=/, "", id)
                             if (NF > 1) { x = $0; sub(/^c?fn=[^ ]* /, "", x); name[id] = x }
                             want = isc && name[id] ~ re; next }
                  want && /^calls=/ { split($1, a, "="); s += a[2] } { want = 0 } END { print s + 0 }' "$1"
}

for so in "${sos[@]}"; do
  [ -f "$so" ] || { echo "fi_insn.sh: $so missing" >&2; exit 1; }
  rm -rf "$w/prov" && mkdir -p "$w/prov" && cp "$so" "$w/prov/libufab-fi.so"
  out=$(FI_PROVIDER_PATH=$w/prov FI_UFAB_DEVICES=shm:insn$$ timeout -k 5 900 valgrind --tool=callgrind \
    --callgrind-out-file="$w/cg.out" --toggle-collect=insn_measured "$bin" --n "$n" 2>"$w/vg.log") ||
    { cat "$w/vg.log" >&2; exit 1; }
  total=$(sed -n 's/^summary: //p' "$w/cg.out")
  locks=$(calls "$w/cg.out" '^pthread_mutex_(try)?lock')
  sys=$(calls "$w/cg.out" '^(syscall|__GI___syscall|futex|write|__write|__libc_write)')
  awk -v so="$so" -v n="$n" -v t="$total" -v l="$locks" -v s="$sys" -v o="$out" 'BEGIN {
    printf "fi_insn: %s: %.0f instructions per round trip (both sides), %.1f mutex acquisitions, %.2f system calls; %s\n",
      so, t / n, l / n, s / n, o }'
  jq -nc --arg so "$so" --argjson n "$n" --argjson t "$total" --argjson l "$locks" --argjson s "$sys" \
    '{library: $so, round_trips: $n, instructions_per_round_trip: ($t / $n), mutex_acquisitions_per_round_trip: ($l / $n),
      system_calls_per_round_trip: ($s / $n)}' >>"$w/results.jsonl"
done
mkdir -p "$(dirname "$json")"
jq -s --arg date "$(date -u +%FT%TZ)" --arg commit "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" \
  '{command: "tests/bench/fi_insn.sh", date: $date, commit: $commit, results: .}' "$w/results.jsonl" >"$json"
echo "fi_insn: written: $json"
