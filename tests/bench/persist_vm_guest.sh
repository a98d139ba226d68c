#!/usr/bin/env bash
# Runs in the VM that tests/bench/persist_vm.sh boots (three e1000e NICs, an
# emulated NVDIMM, two virtio-blk disks, 2 vCPUs, TCG). Benchmark, not a
# test: it prints one "persist_vm: run {...}" or "persist_vm: lat {...}"
# JSON line per measurement on stdout, progress on stderr; the host script
# makes the table.
#
#  0. Setup: two devdax namespaces on the NVDIMM (/dev/dax0.0, /dev/dax0.1:
#     one per `ufab perf` process, since --pmem maps from offset 0), NIC 1
#     (00:02.0) and NIC 3 (00:04.0) on vfio-pci, rxe0 on NIC 2 (kernel
#     e1000e, 10.0.0.1).
#  1. Commit cost: two `ufab perf` processes over swnic (shared memory
#     between two processes of the guest; no NIC model in the path, so the
#     figures are ufab's and the target memory's, not QEMU's e1000e),
#     write-lat (-n ITERS) and write-bw (-D SECONDS) at each size, four ways
#     alternating within a round:
#       plain    WRITE alone
#       global   --flush global into DRAM (the server's memfd buffer)
#       disk     --flush persistent, --pmem the virtio-blk disk (server
#                $UFAB_VM_DISK1, write-lat's client $UFAB_VM_DISK2): the
#                target msyncs the range to the block device (a cache
#                flush to virtio-blk, an fdatasync on the host's image)
#       devdax   --flush persistent, --pmem /dev/dax0.0 (client
#                /dev/dax0.1): cache-line write-back and a store fence
#  2. FLUSH latency by target: tests/vm/cases/flush_peer --latency N on NIC
#     1 (ufab, 10.0.0.2) against, alternating per round, the kernel's rxe0
#     (tests/vm/peers/flush_verbs --listen, NIC 2) and a ufab target
#     (flush_peer --listen on NIC 3, 10.0.0.3), both with their pmem region
#     on /dev/dax0.0: 64-byte WRITE, FLUSH GLOBAL (DRAM), FLUSH PERSISTENT
#     (devdax) and commit-complete WRITE round trips, one at a time, all on
#     the initiator's QP 0.
#
# Environment (from the host script): PV_ROUNDS, PV_SIZES, PV_ITERS,
# PV_SECONDS, PV_LAT_ROUNDS, PV_LAT_N, PV_PARTS ("1 2"), UFAB_BIN,
# FLUSH_PEER_BIN, FLUSH_VERBS_BIN.
# shellcheck disable=SC2034,SC2154  # passed, failed: rxe_guest_lib.sh's counters; rxe_gid_index: its output
set -uo pipefail
here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
root=$(cd -- "$here/../.." && pwd)
ufab=${UFAB_BIN:-$root/bazel-bin/tools/ufab/ufab}
peer_bin=${FLUSH_PEER_BIN:-$root/bazel-bin/tests/vm/cases/flush_peer}
verbs_bin=${FLUSH_VERBS_BIN:-$root/bazel-bin/tests/vm/peers/flush_verbs}
rounds=${PV_ROUNDS:-1} sizes=${PV_SIZES:-64 4096 65536} iters=${PV_ITERS:-500} secs=${PV_SECONDS:-2}
lat_rounds=${PV_LAT_ROUNDS:-3} lat_n=${PV_LAT_N:-200} parts=" ${PV_PARTS:-1 2} "
init_bdf=0000:00:02.0 kern_bdf=0000:00:03.0 utgt_bdf=0000:00:04.0
prog=persist_vm
passed=0 failed=0
w=$(mktemp -d)
# say, wait_line, rxe_setup
# shellcheck source=tests/vm/rxe_guest_lib.sh
. "$root/tests/vm/rxe_guest_lib.sh"
note() { say "$*" >&2; }
die() { note "FAILED: $*"; exit 1; }

for b in "$ufab" "$peer_bin" "$verbs_bin"; do [ -x "$b" ] || die "$b is missing"; done
command -v jq >/dev/null || die "jq is missing"

# ------------------------------------------------------------------ 0. setup
disk1=${UFAB_VM_DISK1:-} disk2=${UFAB_VM_DISK2:-}
{ [ -b "$disk1" ] && [ -b "$disk2" ]; } || die "two virtio-blk disks expected (UFAB_VM_DISK1='$disk1', UFAB_VM_DISK2='$disk2')"
[ -e /sys/bus/nd/devices/region0 ] || die "no NVDIMM region0 (run-vm --nvdimm)"
each=$(( (${UFAB_VM_NVDIMM_MB:-0} - 1) / 16 * 16 / 2 / 16 * 16 ))
{ timeout 60 ndctl disable-region region0 && timeout 60 ndctl init-labels -f nmem0 &&
  timeout 60 ndctl enable-region region0 &&
  timeout 60 ndctl create-namespace --mode=devdax -r region0 --size="${each}M" --align=2M &&
  timeout 60 ndctl create-namespace --mode=devdax -r region0 --size="${each}M" --align=2M; } >"$w/ndctl.out" 2>&1
if [ ! -c /dev/dax0.0 ] || [ ! -c /dev/dax0.1 ]; then
  sed 's/^/  | /' "$w/ndctl.out" >&2
  die "ndctl made no /dev/dax0.0 and /dev/dax0.1 on region0"
fi
note "devdax /dev/dax0.0 and /dev/dax0.1 (${each} MiB each, 2 MiB pages); disks $disk1 $disk2"
timeout 60 modprobe vfio-pci || die "modprobe vfio-pci"
for b in "$init_bdf" "$utgt_bdf"; do timeout 60 "$ufab" bind "$b" >/dev/null || die "ufab bind $b"; done
ifname=$(find "/sys/bus/pci/devices/$kern_bdf/net" -mindepth 1 -maxdepth 1 -printf '%f\n' 2>/dev/null | head -n1)
[ -n "$ifname" ] || die "no kernel interface on $kern_bdf"
rxe_setup "$ifname" 10.0.0.1 >&2 || die "rxe0 on $ifname"
idx=$rxe_gid_index
note "rxe0 on $ifname (GID index $idx); ufab on $init_bdf (initiator) and $utgt_bdf (target)"
{ echo "vCPUs $(nproc), guest memory $(($(sed -n 's/MemTotal: *\([0-9]*\).*/\1/p' /proc/meminfo) / 1024)) MiB, kernel $(uname -r)"
  grep -m1 'model name' /proc/cpuinfo
  echo "disk $disk1: $(cat "/sys/block/${disk1#/dev/}/queue/write_cache" 2>/dev/null) cache"; } |
  jq -Rsc '{machine: .}' | sed 's/^/persist_vm: info /'

# ------------------------------------------------------------------ 1. commit cost over swnic
# One measurement: TEST SIZE WAY ROUND; prints the client's JSON (or an
# {"ok": false, "error": ...} object).
server=
measure() {
  local test=$1 size=$2 way=$3 r=$4 sopts=() copts=() port=
  local n="pv$r${test//-/}$size$way" opts=(-s "$size" --json --timeout 30)
  if [ "$test" = write-lat ]; then opts+=(-n "$iters"); else opts+=(-D "$secs"); fi
  case $way in
    global) sopts=(--flush global); copts=(--flush global) ;;
    disk | devdax)
      local p1=$disk1 p2=$disk2
      [ "$way" = devdax ] && p1=/dev/dax0.0 p2=/dev/dax0.1
      sopts=(--flush persistent --pmem "$p1")
      copts=(--flush persistent)
      # write-lat: the server flushes the client's buffer too.
      [ "$test" = write-lat ] && copts+=(--pmem "$p2")
      ;;
  esac
  rm -f "$w"/server.* "$w"/client.*
  taskset -c 0 timeout 180 "$ufab" perf "$test" "swnic:$n:0" --ip 10.0.0.1 -p 0 "${opts[@]}" "${sopts[@]}" \
    >"$w/server.out" 2>"$w/server.err" &
  server=$!
  if wait_line "$w/server.err" 'waiting for a client on TCP port' "$server" 60; then
    port=$(sed -n 's/.*waiting for a client on TCP port \([0-9][0-9]*\).*/\1/p' "$w/server.err")
  fi
  if [ -z "$port" ]; then
    kill "$server" 2>/dev/null; wait "$server"
    jq -nc --arg e "$(grep 'ufab perf:' "$w/server.err" | tail -n 1)" '{ok: false, error: ("server: " + $e)}'
  elif taskset -c 1 timeout 180 "$ufab" perf "$test" "swnic:$n:1" --ip 10.0.0.2 -p "$port" "${opts[@]}" "${copts[@]}" \
    127.0.0.1 >"$w/client.out" 2>"$w/client.err"; then
    cat "$w/client.out"
    wait "$server"
  else
    jq -nc --arg e "$(grep 'ufab perf:' "$w/client.err" | tail -n 1)" '{ok: false, error: ("client: " + $e)}'
    kill "$server" 2>/dev/null; wait "$server"
  fi
  server=
  rm -f /dev/shm/ufab-swnic-"$n"*
}

if [[ $parts == *" 1 "* ]]; then
  for r in $(seq 1 "$rounds"); do
    for test in write-lat write-bw; do
      for size in $sizes; do
        for way in plain global disk devdax; do
          out=$(measure "$test" "$size" "$way" "$r")
          line=$(jq -c --arg test "$test" --argjson size "$size" --arg way "$way" --argjson round "$r" \
            '{test: $test, size: $size, way: $way, round: $round, ok: .ok, error: .error, memory: .memory,
              t_typical_usec: .results[0].t_typical_usec, bw_avg: .results[0].bw_avg, msg_rate_mpps: .results[0].msg_rate_mpps}' \
            <<<"$out" 2>/dev/null) || line=$(jq -nc --arg test "$test" --argjson size "$size" --arg way "$way" \
            --argjson round "$r" --arg e "unparsable output: ${out:0:200}" \
            '{test: $test, size: $size, way: $way, round: $round, ok: false, error: $e}')
          echo "persist_vm: run $line"
          note "round $r: $test $size B $way: $(jq -r 'if .ok then (if .t_typical_usec then "\(.t_typical_usec) us" else "\(.bw_avg) MiB/s" end) else .error end' <<<"$line")"
        done
      done
    done
  done
fi

# ------------------------------------------------------------------ 2. FLUSH latency: rxe target vs ufab target
# One pair: TARGET (rxe or ufab) ROUND. The target in the background, the
# initiator once the target printed its port.
lat_pair() {
  local tgt=$1 r=$2 tpid port irc=125 trc tcmd
  if [ "$tgt" = rxe ]; then
    tcmd=("$verbs_bin" --device rxe0 --gid-index "$idx" --timeout 60 --listen 0 --pmem /dev/dax0.0)
  else
    tcmd=("$peer_bin" --device "$utgt_bdf" --ip 10.0.0.3 --timeout 60 --listen 0 --pmem /dev/dax0.0)
  fi
  rm -f "$w"/t.* "$w"/i.*
  : >"$w/i.out"
  timeout 300 "${tcmd[@]}" >"$w/t.out" 2>"$w/t.err" &
  tpid=$!
  if wait_line "$w/t.out" 'listening on TCP port' "$tpid" 60; then
    port=$(sed -n 's/.*listening on TCP port \([0-9][0-9]*\).*/\1/p' "$w/t.out")
    timeout 300 "$peer_bin" --device "$init_bdf" --ip 10.0.0.2 --timeout 60 --latency "$lat_n" \
      --connect "127.0.0.1:$port" >"$w/i.out" 2>"$w/i.err"
    irc=$?
  fi
  wait "$tpid"; trc=$?
  local any=0 s line n mn md p9 mx
  for s in write flush-global flush-persistent commit-write; do
    line=$(grep -m1 "^flush_peer: latency $s: " "$w/i.out")
    line=${line#"flush_peer: latency $s: "}
    if [[ $line == n\ * ]]; then
      # "n N, min A, median B, p99 C, max D usec"
      read -r n mn md p9 mx <<<"$(tr -d ',' <<<"$line" | awk '{print $2, $4, $6, $8, $10}')"
      jq -nc --arg t "$tgt" --argjson r "$r" --arg s "$s" --argjson n "$n" --argjson mn "$mn" --argjson md "$md" \
        --argjson p9 "$p9" --argjson mx "$mx" \
        '{target: $t, round: $r, series: $s, ok: true, n: $n, min_usec: $mn, median_usec: $md, p99_usec: $p9, max_usec: $mx}' |
        sed 's/^/persist_vm: lat /'
      note "round $r: $tgt target: $s: $line"
    else
      any=1
      jq -nc --arg t "$tgt" --argjson r "$r" --arg s "$s" \
        --arg e "${line:-no result (initiator exited $irc, target $trc): $(tail -n 1 "$w/i.err" "$w/t.err" 2>/dev/null | tr '\n' ' ')}" \
        '{target: $t, round: $r, series: $s, ok: false, error: $e}' | sed 's/^/persist_vm: lat /'
      note "round $r: $tgt target: $s: FAILED: ${line:-no result}"
    fi
  done
  if [ "$any" = 1 ]; then
    for f in t.out t.err i.out i.err; do [ -s "$w/$f" ] && { echo "--- $f" >&2; sed 's/^/  | /' "$w/$f" | tail -n 15 >&2; }; done
  fi
}

if [[ $parts == *" 2 "* ]]; then
  for r in $(seq 1 "$lat_rounds"); do
    lat_pair rxe "$r"
    lat_pair ufab "$r"
  done
fi
rm -rf "$w"
note "done"
