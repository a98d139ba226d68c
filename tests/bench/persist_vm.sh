#!/usr/bin/env bash
# Benchmark, not a test: what a commit costs per target type, and a FLUSH's
# round trip to the kernel's rxe against one to ufab, in one VM boot (q35,
# TCG, 2 vCPUs, three e1000e NICs on one hub, an emulated NVDIMM of 256 MiB,
# two virtio-blk disks backed by sparse images in --work-dir).
# tests/bench/persist_vm_guest.sh runs in the guest:
#   1. two `ufab perf` processes over swnic: write-lat (t_typical, half a
#      round trip) and write-bw (bw_avg) at 64 B, 4 KiB, 64 KiB, four ways:
#      plain; --flush global into DRAM; --flush persistent with --pmem the
#      virtio-blk disk (msync to the block device); --flush persistent with
#      --pmem a devdax namespace of the NVDIMM (cache-line write-back). The
#      figures are the ratios to plain (of the medians over the rounds).
#   2. tests/vm/cases/flush_peer --latency on NIC 1 (vfio, ufab initiator)
#      against the kernel's rxe0 on NIC 2 (flush_verbs target) and against
#      a ufab target on NIC 3 (flush_peer target), alternating per round,
#      both with their pmem region on /dev/dax0.0: 64-byte WRITE, FLUSH
#      GLOBAL (DRAM), FLUSH PERSISTENT (devdax), commit-complete WRITE,
#      one at a time. The figure is rxe-target / ufab-target of the median
#      round trips (medians over the rounds).
# Prints progress lines, a table per part, and writes
# docs/bench/persist_vm.json (or --json FILE). docs/benchmarks.md has the
# figures and their limits.
#
#   tests/bench/persist_vm.sh [--rounds N] [--iters N] [--seconds S]
#                             [--lat-rounds N] [--lat-n N] [--parts "1 2"]
#                             [--work-dir DIR] [--json FILE]
#
# --rounds (3): rounds of part 1, the four ways alternating within each.
# --iters (500): write-lat's -n. --seconds (2): write-bw's -D.
# --lat-rounds (5), --lat-n (200): part 2's rounds and round trips per
# series. --parts: which parts run. --work-dir (.bench/ under the
# repository, a disk here): the disk images and a private copy of the
# binaries (the guest sees the host's / through 9p, but not its /tmp).
# The VM is bounded (--timeout of run-vm: 300 s plus an estimate of the
# parts); about 6 minutes with the defaults on a 2-core host.
# Needs: jq, ndctl (scripts/setup.sh), the VM kernel (tests/vm/fetch-kernel.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=3 iters=500 secs=2 lat_rounds=5 lat_n=200 parts="1 2" work=.bench json=docs/bench/persist_vm.json
usage() {
  echo "usage: $0 [--rounds N] [--iters N] [--seconds S] [--lat-rounds N] [--lat-n N] [--parts \"1 2\"] [--work-dir DIR] [--json FILE]" >&2
  exit 2
}
while [[ $# -gt 0 ]]; do
  case "$1" in
    --rounds) rounds=${2:?}; shift 2 ;;
    --iters) iters=${2:?}; shift 2 ;;
    --seconds) secs=${2:?}; shift 2 ;;
    --lat-rounds) lat_rounds=${2:?}; shift 2 ;;
    --lat-n) lat_n=${2:?}; shift 2 ;;
    --parts) parts=${2:?}; shift 2 ;;
    --work-dir) work=${2:?}; shift 2 ;;
    --json) json=${2:?}; shift 2 ;;
    *) usage ;;
  esac
done
for v in "$rounds" "$iters" "$secs" "$lat_rounds" "$lat_n"; do
  [[ $v =~ ^[1-9][0-9]*$ ]] || { echo "persist_vm: '$v' is not a positive whole number" >&2; exit 2; }
done
command -v jq >/dev/null || { echo "persist_vm: jq is needed (apt-get install jq)" >&2; exit 1; }
command -v ndctl >/dev/null || { echo "persist_vm: ndctl is needed in the guest (scripts/setup.sh installs it)" >&2; exit 1; }
say() { echo "persist_vm: $*" >&2; }
say "building //tools/ufab //tests/vm/cases:flush_peer //tests/vm/peers:flush_verbs"
bazel build //tools/ufab //tests/vm/cases:flush_peer //tests/vm/peers:flush_verbs >/dev/null 2>&1 ||
  { echo "persist_vm: build failed: bazel build //tools/ufab //tests/vm/cases:flush_peer //tests/vm/peers:flush_verbs" >&2; exit 1; }
mkdir -p "$work" "$(dirname "$json")"
tmp=$(mktemp -d "$(realpath "$work")/persist_vm.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
# Private copies: a rebuild meanwhile does not change them.
for b in tools/ufab/ufab tests/vm/cases/flush_peer tests/vm/peers/flush_verbs; do cp "bazel-bin/$b" "$tmp/"; done
truncate -s 16M "$tmp/disk1.img" "$tmp/disk2.img"

# The guest's bound: boot and setup, then each measurement's start-up and
# run under TCG, with room to spare.
nsizes=3
vm_timeout=$((300 + rounds * 2 * 4 * nsizes * (30 + secs + iters / 50) + lat_rounds * 2 * (60 + lat_n / 2)))
say "one VM: part(s) $parts; part 1: $rounds round(s), -n $iters, -D $secs; part 2: $lat_rounds round(s) of $lat_n; bound ${vm_timeout} s"
{ echo "host: nproc $(nproc), $(uname -r), $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //'), load before $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "qemu: $(qemu-system-x86_64 --version | head -n1)"; } >"$tmp/machine.txt"
set +e
tests/vm/run-vm --timeout "$vm_timeout" --mem 2048 --smp 2 --nvdimm 256 --nic e1000e --nic e1000e --nic e1000e \
  --disk "$tmp/disk1.img" --disk "$tmp/disk2.img" \
  --env "UFAB_BIN=$tmp/ufab" --env "FLUSH_PEER_BIN=$tmp/flush_peer" --env "FLUSH_VERBS_BIN=$tmp/flush_verbs" \
  --env "PV_ROUNDS=$rounds" --env "PV_ITERS=$iters" --env "PV_SECONDS=$secs" --env "PV_LAT_ROUNDS=$lat_rounds" \
  --env "PV_LAT_N=$lat_n" --env "PV_PARTS=$parts" \
  -- tests/bench/persist_vm_guest.sh >"$tmp/out.log" 2> >(tee "$tmp/err.log" >&2)
rc=$?
set -e
echo "host: load after $(cut -d' ' -f1-3 /proc/loadavg)" >>"$tmp/machine.txt"
sed -n 's/^persist_vm: run //p' "$tmp/out.log" >"$tmp/runs.jsonl"
sed -n 's/^persist_vm: lat //p' "$tmp/out.log" >"$tmp/lat.jsonl"
guest_machine=$(sed -n 's/^persist_vm: info //p' "$tmp/out.log" | jq -r '.machine' 2>/dev/null || true)
if [ "$rc" -ne 0 ]; then
  say "the VM run exited with $rc (its output above); $(wc -l <"$tmp/runs.jsonl") part-1 and $(wc -l <"$tmp/lat.jsonl") part-2 results came back"
  [ -s "$tmp/runs.jsonl" ] || [ -s "$tmp/lat.jsonl" ] || exit 1
fi

jq -n --slurpfile runs "$tmp/runs.jsonl" --slurpfile lat "$tmp/lat.jsonl" \
  --arg cmd "tests/bench/persist_vm.sh --rounds $rounds --iters $iters --seconds $secs --lat-rounds $lat_rounds --lat-n $lat_n" \
  --arg date "$(date -u +%FT%TZ)" --arg machine "$(cat "$tmp/machine.txt")" --arg guest "$guest_machine" --argjson rc "$rc" '
  def median: sort | if length == 0 then null elif length % 2 == 1 then .[length / 2 | floor] else (.[length / 2 - 1] + .[length / 2]) / 2 end;
  def ratio(a; b): if a and b then a / b else null end;
  ([$runs | group_by([.test, .size, .way])[]
     | (.[0].test == "write-lat") as $l
     | (map(select(.ok) | if $l then .t_typical_usec else .bw_avg end)) as $v
     | {test: .[0].test, size: .[0].size, way: .[0].way, runs: length, ok: ($v | length),
        memory: (map(select(.ok) | .memory) | first),
        error: (map(select(.ok | not) | .error) | first),
        median: ($v | median), best: (if ($v | length) == 0 then null elif $l then ($v | min) else ($v | max) end)}]) as $cells
  | ([$lat | group_by([.target, .series])[]
     | (map(select(.ok))) as $ok
     | {target: .[0].target, series: .[0].series, rounds: length, ok: ($ok | length),
        error: (map(select(.ok | not) | .error) | first),
        median_usec: ($ok | map(.median_usec) | median), min_usec: ($ok | map(.min_usec) | min),
        p99_usec: ($ok | map(.p99_usec) | median)}]) as $lcells
  | {description: "Part 1: write-lat (t_typical, usec) and write-bw (bw_avg, MiB/s) over swnic between two ufab perf processes in a TCG VM: plain, --flush global (DRAM), --flush persistent with --pmem a virtio-blk disk (msync) and a devdax namespace of an emulated NVDIMM (cache-line write-back); ratios way / plain of the medians over the rounds (and of the best rounds). Part 2: 64-byte round trips (usec) from flush_peer --latency on a vfio e1000e to the kernel rxe target (flush_verbs) and to a ufab target (flush_peer), each on its own e1000e of the same hub, pmem on devdax; ratio rxe / ufab of the medians over the rounds (each round a median of n round trips).",
     command: $cmd, date: $date, machine: $machine, guest: $guest, vm_exit: $rc,
     commit: {cells: $cells,
       table: [$cells | group_by([.test, .size])[]
         | (map({key: .way, value: .}) | from_entries) as $w
         | {test: .[0].test, size: .[0].size,
            plain: $w.plain.median, global: $w.global.median, disk: $w.disk.median, devdax: $w.devdax.median,
            plain_best: $w.plain.best, global_best: $w.global.best, disk_best: $w.disk.best, devdax_best: $w.devdax.best,
            errors: ([$w[] | select(.ok == 0) | {way, error}])}
         | . + {global_ratio: ratio(.global; .plain), disk_ratio: ratio(.disk; .plain), devdax_ratio: ratio(.devdax; .plain),
                global_ratio_best: ratio(.global_best; .plain_best), disk_ratio_best: ratio(.disk_best; .plain_best),
                devdax_ratio_best: ratio(.devdax_best; .plain_best)}]},
     flush_latency: {cells: $lcells,
       table: [$lcells | group_by(.series)[]
         | (map({key: .target, value: .}) | from_entries) as $t
         | {series: .[0].series, rxe_median_usec: $t.rxe.median_usec, ufab_median_usec: $t.ufab.median_usec,
            rxe_min_usec: $t.rxe.min_usec, ufab_min_usec: $t.ufab.min_usec,
            rxe_p99_usec: $t.rxe.p99_usec, ufab_p99_usec: $t.ufab.p99_usec,
            rxe_over_ufab: ratio($t.rxe.median_usec; $t.ufab.median_usec),
            errors: ([$t[] | select(.ok == 0) | {target, error}])}]},
     runs: $runs, latency_runs: $lat}' >"$json"

echo
cat "$tmp/machine.txt"
[ -z "$guest_machine" ] || echo "guest: $guest_machine" | head -n 2
if [[ " $parts " == *" 1 "* ]]; then
  echo
  echo "1. commit cost over swnic in the VM (medians over $rounds round(s); ratio to plain, best round in parentheses)"
  printf '%-9s %6s %9s %9s %9s %9s %16s %16s %16s\n' test bytes plain global disk devdax "glob/pl" "disk/pl" "dax/pl"
  jq -r 'def f(d): if . == null then "n/a" else (. * d | round / d | tostring) end;
    .commit.table | sort_by(.test, .size)[] | [.test, .size, (.plain | f(100)), (.global | f(100)), (.disk | f(100)), (.devdax | f(100)),
      "\(.global_ratio | f(1000)) (\(.global_ratio_best | f(1000)))", "\(.disk_ratio | f(1000)) (\(.disk_ratio_best | f(1000)))",
      "\(.devdax_ratio | f(1000)) (\(.devdax_ratio_best | f(1000)))"] | @tsv' "$json" |
    while IFS=$'\t' read -r t s p g d x gr dr xr; do
      printf '%-9s %6s %9s %9s %9s %9s %16s %16s %16s\n' "$t" "$s" "$p" "$g" "$d" "$x" "$gr" "$dr" "$xr"
    done
  echo "(write-lat: t_typical usec, half a round trip; write-bw: bw_avg MiB/s)"
  jq -r '.commit.table[] | .errors[] | "n/a: \(.way): \(.error)"' "$json" | sort -u
fi
if [[ " $parts " == *" 2 "* ]]; then
  echo
  echo "2. 64-byte round trips from a ufab initiator (vfio e1000e), usec: median over $lat_rounds round(s) of each round's median of $lat_n"
  printf '%-17s %10s %10s %10s %10s %10s %10s %9s\n' series "rxe med" "ufab med" "rxe min" "ufab min" "rxe p99" "ufab p99" "rxe/ufab"
  jq -r 'def f(d): if . == null then "n/a" else (. * d | round / d | tostring) end;
    .flush_latency.table as $t | ["write", "flush-global", "flush-persistent", "commit-write"][] as $s
    | $t[] | select(.series == $s)
    | [.series, (.rxe_median_usec | f(10)), (.ufab_median_usec | f(10)), (.rxe_min_usec | f(10)), (.ufab_min_usec | f(10)),
       (.rxe_p99_usec | f(10)), (.ufab_p99_usec | f(10)), (.rxe_over_ufab | f(100))] | @tsv' "$json" |
    while IFS=$'\t' read -r s a b c d e f g; do printf '%-17s %10s %10s %10s %10s %10s %10s %9s\n' "$s" "$a" "$b" "$c" "$d" "$e" "$f" "$g"; done
  jq -r '.flush_latency.table[] | .errors[] | "n/a: \(.target): \(.error)"' "$json" | sort -u
fi
echo "written: $json"
[ "$rc" -eq 0 ]
