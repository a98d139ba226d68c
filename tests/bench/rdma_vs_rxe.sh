#!/usr/bin/env bash
# Benchmark, not a test: ufab's RDMA against the kernel's soft-RoCE (rxe) on
# the same emulated NIC, and ufab's software NIC against UCX's shared
# memory transport on the host, all in one run. Prints a table and writes
# docs/bench/rdma_vs_rxe.json and docs/bench/rdma_vs_rxe.svg (latency and
# bandwidth against message size). docs/benchmarks.md explains the setup.
#
#   1. host: `ufab perf` over swnic against `ucx_perftest` (UCT put over
#      posix shared memory): put/WRITE latency and bandwidth per size, the
#      two processes of each run pinned to different cores
#   2. two VMs (TCG, e1000e, hubs joined with run-vm --hub-link), in each
#      VM a vfio e1000e for ufab and a kernel e1000e with rxe0: perftest's
#      ib_write_lat / ib_write_bw between the two rxe0, and `ufab perf
#      write-lat / write-bw` between the two ufab NICs, size by size
#   3. one VM (2 vCPUs) with two vfio e1000e: ufab's raw frame rate on that
#      NIC (`ufab pktgen`, 138-byte frames: the size of a 64-byte RoCE
#      WRITE) and the same ufab runs between the two NICs
#
# Usage: tests/bench/rdma_vs_rxe.sh                 (about 8 minutes)
#        BENCH_QUICK=1 tests/bench/rdma_vs_rxe.sh   (about 1 minute: 2 sizes, short runs, once)
# Environment (defaults in brackets):
#   BENCH_LAT_SIZES  latency sweep ["8 64 512 4096 65536"]
#   BENCH_BW_SIZES   bandwidth sweep ["64 512 4096 65536 1048576"]
#   BENCH_LAT_ITERS, BENCH_LAT_BYTES  VM latency runs: iterations, at most
#                    BENCH_LAT_ITERS [1000] and BENCH_LAT_BYTES / size
#                    [8 MiB], at least 20
#   BENCH_BW_ITERS, BENCH_BW_BYTES    VM bandwidth runs, the same way
#                    [20000, 32 MiB]
#   BENCH_HOST_LAT_ITERS, BENCH_HOST_BW_ITERS, BENCH_HOST_BYTES  the same
#                    for the host runs [100000, 1000000, 1 GiB; latency
#                    runs a quarter of the bytes], at least 100
#   BENCH_REPEAT     runs of every measurement, the report takes the
#                    median [3]
#   BENCH_SMP        vCPUs of each of the two VMs [1]; the single VM has 2
#   BENCH_CEILING_SECS  seconds of pktgen [5]; 0 skips it
#   BENCH_PARTS      which parts run ["host vm onevm"]
#   BENCH_STACKS     which pairs the two VMs run ["rxe ufab"]
#   BENCH_OUT        where the JSON and SVG go [docs/bench/rdma_vs_rxe]
#   BENCH_RUN_LIMIT  seconds for one side of one VM run [150]
#   BENCH_STALL      seconds without a line from a VM after which it is
#                    taken as stuck: its console is shown, it is stopped
#                    and the benchmark goes on [300]
#   BENCH_NO_BUILD=1 use bazel-bin/tools/ufab/ufab as it is
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/bench/ucx_pair.sh
if [ "${BENCH_QUICK:-0}" = 1 ]; then
  : "${BENCH_LAT_SIZES:=8 4096}" "${BENCH_BW_SIZES:=64 65536}"
  : "${BENCH_LAT_ITERS:=300}" "${BENCH_BW_ITERS:=5000}" "${BENCH_BW_BYTES:=8388608}"
  : "${BENCH_HOST_LAT_ITERS:=20000}" "${BENCH_HOST_BW_ITERS:=200000}" "${BENCH_CEILING_SECS:=2}"
  : "${BENCH_REPEAT:=1}"
fi
export BENCH_REPEAT=${BENCH_REPEAT:-3}
export BENCH_LAT_SIZES=${BENCH_LAT_SIZES:-8 64 512 4096 65536}
export BENCH_BW_SIZES=${BENCH_BW_SIZES:-64 512 4096 65536 1048576}
export BENCH_LAT_ITERS=${BENCH_LAT_ITERS:-1000} BENCH_LAT_BYTES=${BENCH_LAT_BYTES:-8388608}
export BENCH_BW_ITERS=${BENCH_BW_ITERS:-20000} BENCH_BW_BYTES=${BENCH_BW_BYTES:-33554432}
export BENCH_CEILING_SECS=${BENCH_CEILING_SECS:-5} BENCH_RUN_LIMIT=${BENCH_RUN_LIMIT:-150}
host_lat_iters=${BENCH_HOST_LAT_ITERS:-100000}
host_bw_iters=${BENCH_HOST_BW_ITERS:-1000000}
host_bytes=${BENCH_HOST_BYTES:-1073741824}
smp=${BENCH_SMP:-1}
parts=${BENCH_PARTS:-host vm onevm}
out=${BENCH_OUT:-docs/bench/rdma_vs_rxe}
ufab=$PWD/bazel-bin/tools/ufab/ufab
cmdline="tests/bench/rdma_vs_rxe.sh"
[ "${BENCH_QUICK:-0}" = 1 ] && cmdline="BENCH_QUICK=1 $cmdline"

say() { printf 'rdma_vs_rxe: %s\n' "$*"; }
die() { say "error: $*" >&2; exit 1; }
has() { [[ " $parts " == *" $1 "* ]]; }

scripts/setup.sh >/dev/null || die "scripts/setup.sh failed"
for t in jq python3 taskset ib_write_lat ucx_perftest ss; do
  command -v "$t" >/dev/null || die "$t not found (scripts/setup.sh installs perftest, ucx-utils, jq)"
done
if [ "${BENCH_NO_BUILD:-0}" != 1 ]; then
  say "building //tools/ufab"
  timeout 1800 bazel build //tools/ufab >/dev/null 2>&1 || die "build failed: bazel build //tools/ufab"
fi
[ -x "$ufab" ] || die "$ufab missing (bazel build //tools/ufab)"

w=$(mktemp -d)
pids=()
# shellcheck disable=SC2317  # called through the trap
cleanup() {
  local p
  # run-vm stops its QEMU on SIGTERM; the host runs end with their timeout.
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$w"
}
trap cleanup EXIT
trap 'say "interrupted"; exit 130' INT
trap 'say "terminated"; exit 143' TERM
results=$w/results.jsonl
: >"$results"
t_start=$SECONDS
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
say "host: $(nproc) CPUs, load average $load_before; sizes: latency $BENCH_LAT_SIZES, bandwidth $BENCH_BW_SIZES"

iters() { # MAXITERS BYTES SIZE [MIN]: MAXITERS, at most BYTES / SIZE, at least MIN (20)
  local n=$(($2 / $3))
  ((n > $1)) && n=$1
  ((n < ${4:-20})) && n=${4:-20}
  echo "$n"
}
cpu_a=0
cpu_b=$(($(nproc) > 1 ? 1 : 0))

# ------------------------------------------------------- 1. host: swnic, UCX
rep=1
# swnic_run TEST SIZE N: ufab perf over an swnic link, server first (it
# says which TCP port it took), client on the other core.
swnic_run() {
  local test=$1 size=$2 n=$3 name=bench$$_$RANDOM port='' spid rc r
  rm -f "$w/s.out" "$w/s.err"  # the port is read from the new server's s.err
  timeout -k 5 120 taskset -c $cpu_a "$ufab" perf "$test" "swnic:$name:0" --ip 10.0.0.1 -s "$size" -n "$n" -p 0 --json \
    >"$w/s.out" 2>"$w/s.err" &
  spid=$!
  for _ in $(seq 300); do
    port=$(sed -n 's/^perf: waiting for a client on TCP port \([0-9]*\)$/\1/p' "$w/s.err")
    [ -n "$port" ] && break
    kill -0 "$spid" 2>/dev/null || break
    sleep 0.1
  done
  if [ -z "$port" ]; then
    say "swnic $test $size: the server did not start"; sed 's/^/  | /' "$w/s.err" | tail -n 5
    wait "$spid" || true
    return 0
  fi
  rc=0
  timeout -k 5 120 taskset -c $cpu_b "$ufab" perf "$test" "swnic:$name:1" --ip 10.0.0.2 -s "$size" -n "$n" -p "$port" --json 127.0.0.1 \
    >"$w/c.out" 2>"$w/c.err" || rc=$?
  wait "$spid" || true
  if [ "$rc" = 0 ] && r=$(jq -ce --arg t "$test" '.results[0] as $r
      | {setup: "host", stack: "swnic", test: $t, size: $r.size, iters: $r.iters, rep: '"$rep"'}
        + (if $t == "write-lat" then {t_typical_usec: $r.t_typical_usec, t_avg_usec: $r.t_avg_usec, p99_usec: $r.p99_usec}
           else {bw_avg_mib: $r.bw_avg, msg_rate_mpps: $r.msg_rate_mpps} end)' "$w/c.out"); then
    echo "$r" >>"$results"
    say "swnic $test $size B x $n: $(jq -r 'if .t_typical_usec then "t_typical \(.t_typical_usec) us" else "\(.bw_avg_mib) MiB/s, \(.msg_rate_mpps * 1e6 | floor) msg/s" end' <<<"$r")"
  else
    say "swnic $test $size B: failed ($rc)"; sed 's/^/  | /' "$w/c.err" | tail -n 5
  fi
}

# ucx_run TEST SIZE N: ucx_perftest (UCT, posix shared memory, short puts;
# ucx_pair.sh) for ufab perf's TEST.
ucx_run() {
  local test=$1 size=$2 n=$3 rc=0 r
  local t=put_lat
  [ "$test" = write-bw ] && t=put_bw
  if ucx_pair "$t" "$size" "$n" 120; then
    local f=("${ucx_fields[@]}")
    if [ "$test" = write-lat ]; then
      r=$(jq -nc --argjson s "$size" --argjson n "$n" --argjson typ "${f[1]}" --argjson avg "${f[3]}" \
        '{setup: "host", stack: "ucx", test: "write-lat", size: $s, iters: $n, t_typical_usec: $typ, t_avg_usec: $avg}')
      r=$(jq -c --argjson rep "$rep" '. + {rep: $rep}' <<<"$r")
    else
      r=$(jq -nc --argjson s "$size" --argjson n "$n" --argjson bw "${f[5]}" --argjson mr "${f[7]}" \
        '{setup: "host", stack: "ucx", test: "write-bw", size: $s, iters: $n, bw_avg_mib: $bw, msg_rate_mpps: ($mr / 1e6)}')
      r=$(jq -c --argjson rep "$rep" '. + {rep: $rep}' <<<"$r")
    fi
    echo "$r" >>"$results"
    say "ucx $t $size B x $n: $(jq -r 'if .t_typical_usec then "median \(.t_typical_usec) us" else "\(.bw_avg_mib) MiB/s, \(.msg_rate_mpps * 1e6 | floor) msg/s" end' <<<"$r")"
  else
    rc=$?
    say "ucx $t $size B: failed ($rc)"; sed 's/^/  | /' "$w/c.out" | tail -n 5
  fi
}

if has host; then
  say "1/3 host: ufab perf over swnic vs ucx_perftest over posix shared memory (CPUs $cpu_a and $cpu_b)"
  for s in $BENCH_LAT_SIZES; do
    n=$(iters "$host_lat_iters" "$((host_bytes / 4))" "$s" 100)
    for ((rep = 1; rep <= BENCH_REPEAT; rep++)); do
      swnic_run write-lat "$s" "$n"
      ucx_run write-lat "$s" "$n"
    done
  done
  for s in $BENCH_BW_SIZES; do
    n=$(iters "$host_bw_iters" "$host_bytes" "$s" 100)
    for ((rep = 1; rep <= BENCH_REPEAT; rep++)); do
      swnic_run write-bw "$s" "$n"
      ucx_run write-bw "$s" "$n"
    done
  done
fi

# ------------------------------------------------------------------ the VMs
benv=()
export BENCH_STACKS=${BENCH_STACKS:-rxe ufab}
for v in BENCH_LAT_SIZES BENCH_BW_SIZES BENCH_LAT_ITERS BENCH_LAT_BYTES BENCH_BW_ITERS BENCH_BW_BYTES \
  BENCH_REPEAT BENCH_CEILING_SECS BENCH_RUN_LIMIT BENCH_STACKS; do
  benv+=(--env "$v")
done
vm_timeout=3600
stall=${BENCH_STALL:-300}
# follow PID FILE...: shows a run's progress lines while PID runs.
follow() {
  local pid=$1
  shift
  tail -q -n +1 -s 0.5 -f --pid="$pid" "$@" 2>/dev/null | grep --line-buffered -E '^(bench |run-vm|  \| )' || true
}
# watch PID FILE...: waits for run-vm PID and returns its status. When
# none of FILEs has grown for $stall seconds, the VM is taken as stuck:
# its serial console is shown (the guest script turns on hung task
# reports there) and run-vm is stopped.
watch_vm() {
  local pid=$1 last=-1 since=$SECONDS size q console
  shift
  while kill -0 "$pid" 2>/dev/null; do
    size=$(cat "$@" 2>/dev/null | wc -c)
    if [ "$size" != "$last" ]; then last=$size since=$SECONDS; fi
    if ((SECONDS - since >= stall)); then
      say "no output from the VM (run-vm $pid) for $stall s: it seems stuck; stopping it"
      q=$(pgrep -P "$pid" -x qemu-system-x86 | head -n1)
      console=$( [ -n "$q" ] && tr '\0' '\n' <"/proc/$q/cmdline" | sed -n 's/^file:\(.*console\.log\)$/\1/p')
      if [ -n "$console" ] && [ -s "$console" ]; then
        say "its serial console, the last 60 lines:"
        tr -d '\r' <"$console" | tail -n 60 | sed 's/^/  | /'
      fi
      kill -TERM "$pid" 2>/dev/null
      break
    fi
    sleep 2
  done
  wait "$pid"
}
collect() { # FILE...: the RESULT lines into the results
  sed -n 's/^RESULT //p' "$@" >>"$results"
}

if has vm; then
  say "2/3 two VMs ($smp vCPU each), hubs joined: rxe <-> rxe and ufab <-> ufab"
  sock=$w/hub.sock
  common=(--smp "$smp" --mem 1024 --timeout "$vm_timeout" --env UFAB_BIN="$ufab" "${benv[@]}")
  tests/vm/run-vm "${common[@]}" --hub-link "listen=$sock" --env ROLE=A \
    --nic e1000e:52:54:00:0a:00:01 --nic e1000e:52:54:00:0a:00:02 \
    -- tests/bench/rdma_vs_rxe_guest.sh >"$w/a.out" 2>"$w/a.err" &
  pa=$!
  pids+=("$pa")
  tests/vm/run-vm "${common[@]}" --hub-link "connect=$sock" --env ROLE=B \
    --nic e1000e:52:54:00:0b:00:01 --nic e1000e:52:54:00:0b:00:02 \
    -- tests/bench/rdma_vs_rxe_guest.sh >"$w/b.out" 2>"$w/b.err" &
  pb=$!
  pids+=("$pb")
  follow "$pa" "$w/a.out" "$w/a.err" &
  follow "$pb" "$w/b.out" "$w/b.err" &
  rca=0 rcb=0
  watch_vm "$pa" "$w/a.out" "$w/b.out" || rca=$?
  watch_vm "$pb" "$w/a.out" "$w/b.out" || rcb=$?
  sleep 1
  pids=()
  [ "$rca" = 0 ] || say "VM A ended with status $rca (see above)"
  [ "$rcb" = 0 ] || say "VM B ended with status $rcb (see above)"
  collect "$w/b.out"
fi

if has onevm; then
  say "3/3 one VM (2 vCPUs), two vfio e1000e: raw frame rate and ufab <-> ufab inside it"
  tests/vm/run-vm --smp 2 --mem 1024 --timeout "$vm_timeout" --env UFAB_BIN="$ufab" "${benv[@]}" --env ROLE=ONE \
    --nic e1000e --nic e1000e -- tests/bench/rdma_vs_rxe_guest.sh >"$w/one.out" 2>"$w/one.err" &
  po=$!
  pids+=("$po")
  follow "$po" "$w/one.out" "$w/one.err" &
  rco=0
  watch_vm "$po" "$w/one.out" || rco=$?
  sleep 1
  pids=()
  [ "$rco" = 0 ] || say "the single VM ended with status $rco (see above)"
  collect "$w/one.out"
fi

# ----------------------------------------------------------------- report
mkdir -p "$(dirname "$out")"
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
git diff --quiet HEAD -- 2>/dev/null || commit="$commit+changes"
jq -n --arg cmd "$cmdline" --arg date "$(date -u +%FT%TZ)" --arg commit "$commit" \
  --arg qemu "$(qemu-system-x86_64 --version | head -n1)" \
  --arg guest "$(basename "$(cat "${UFAB_VM_CACHE:-$HOME/.cache/ufab/vm}/kernel" 2>/dev/null)" | sed 's/^kernel-//')" \
  --arg host "$(uname -r)" --argjson cpus "$(nproc)" --arg load_before "$load_before" \
  --arg load_after "$(cut -d' ' -f1-3 /proc/loadavg)" \
  --arg perftest "$(ib_write_bw --version 2>/dev/null | head -n1 | sed 's/^Version: //')" \
  --arg ucx "$(ucx_info -v 2>/dev/null | sed -n 's/^# Version //p' | head -n1)" \
  --argjson smp "$smp" --argjson repeat "$BENCH_REPEAT" --argjson secs $((SECONDS - t_start)) \
  --arg lat "$BENCH_LAT_SIZES" --arg bw "$BENCH_BW_SIZES" \
  --slurpfile runs "$results" \
  '{command: $cmd, date: $date, commit: $commit, seconds: $secs,
    host: {kernel: $host, cpus: $cpus, load_before: $load_before, load_after: $load_after},
    qemu: $qemu, accel: "tcg", guest_kernel: $guest, vm_smp: $smp, nic: "e1000e", repeat: $repeat,
    perftest: $perftest, ucx: $ucx,
    sizes: {latency: ($lat | split(" ") | map(select(. != "") | tonumber)),
            bandwidth: ($bw | split(" ") | map(select(. != "") | tonumber))},
    runs: $runs}' >"$out.json"
python3 tests/bench/rdma_vs_rxe_report.py "$out.json" "$out.svg"
say "written: $out.json, $out.svg ($((SECONDS - t_start)) s)"
