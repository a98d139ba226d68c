#!/usr/bin/env bash
# Runs inside the VM of tests/vm/suites/fabric.sh (see there): the
# libfabric provider (libufab-fi.so) over two vfio-bound e1000e NICs on
# the VM's QEMU hub, each NIC driven by ufab's soft-RoCE in its own
# process: NIC 1 (00:02.0) as 10.0.0.1, NIC 2 (00:03.0) as 10.0.0.2.
#
#   fi_info   `fi_info -p ufab` with both NICs configured lists both
#             domains, FI_EP_MSG and FI_EP_DGRAM each, with their addresses
#   pingpong  fi_pingpong -e msg, -e dgram (-p ufab) and -e rdm (msg and
#             tagged; FI_PROVIDER="ufab;ofi_rxm"), each with -c (data
#             checked): server on NIC 1, client on NIC 2 (fi_pingpong's
#             control connection over 127.0.0.1, the fabric traffic over
#             the hub)
#   mpi       Open MPI, two ranks, rank r on NIC r+1 (docs/fabric.md's
#             recipe: pml cm, mtl ofi, "ufab;ofi_rxm"): mpi_check (1 B to
#             4 MiB with every byte checked, allreduce and bcast) and hpcc
#             (small N; its own checks must pass)
#
# Every process reports its device's counters when it ends
# (FI_UFAB_STATS=1): each case also checks that both NICs sent and received
# RoCE frames, which on a vfio-bound NIC can only have crossed the hub
# (the host side counts them once more in the pcap).
#
# Environment: UFAB_BIN (ufab, for `ufab bind`), FAB_DIR (the host's
# staging directory: prov/libufab-fi.so, mpi_check, hpccinf.txt);
# FAB_CASES (default "fi_info pingpong mpi"), FAB_PP_ITERS (fi_pingpong -I,
# 20). Prints PASS/FAIL lines and "fabric_guest: N passed, M failed".
set -uo pipefail
prog=fabric_guest
ufab=${UFAB_BIN:?set UFAB_BIN to the ufab binary}
dir=${FAB_DIR:?set FAB_DIR to the staging directory}
cases=${FAB_CASES:-fi_info pingpong mpi}
pp_iters=${FAB_PP_ITERS:-20}
nic1=${UFAB_VM_NIC1_BDF:-0000:00:02.0}
nic2=${UFAB_VM_NIC2_BDF:-0000:00:03.0}
dev1="$nic1@10.0.0.1"
dev2="$nic2@10.0.0.2"
w=$(mktemp -d)
server_pid=
cleanup() {
  if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null; wait "$server_pid" 2>/dev/null; fi
  rm -rf "$w"
}
trap cleanup EXIT
passed=0 failed=0
say() { printf '%s: %s\n' "$prog" "$*"; }
pass() { passed=$((passed + 1)); echo "PASS $*"; }
fail() { failed=$((failed + 1)); echo "FAIL $*"; }
finish() {
  echo "$prog: $passed passed, $failed failed"
  [ "$failed" -eq 0 ]
  exit
}
# bounded LIMIT OUT COMMAND...: runs COMMAND (output to the file OUT, or
# where it goes when OUT is "-") for at most
# LIMIT seconds. A command still running then is reported (every process
# of its tree: state, kernel wait channel, each thread's user stack from
# gdb), killed, and returns 124. A CI run once hung here past every
# `timeout` with nothing to show why.
bounded() {
  local limit=$1 out=$2 pid end
  shift 2
  if [ "$out" = - ]; then "$@" & else "$@" >"$out" 2>&1 & fi
  pid=$!
  end=$((SECONDS + limit))
  while kill -0 "$pid" 2>/dev/null && [ "$SECONDS" -lt "$end" ]; do sleep 0.2; done
  if kill -0 "$pid" 2>/dev/null; then
    { echo "TIMEOUT after $limit s: $*"; hang_report "$pid"; } >&3
    kill -KILL $(tree_of "$pid") 2>/dev/null
    wait "$pid" 2>/dev/null
    return 124
  fi
  wait "$pid"
}
tree_of() { # PID: it and its descendants
  local c
  echo "$1"
  for c in $(cat /proc/"$1"/task/*/children 2>/dev/null); do tree_of "$c"; done
}
hang_report() { # PID: what its process tree is doing
  local p
  for p in $(tree_of "$1"); do
    ps -o pid=,stat=,wchan:24=,etime=,args= -p "$p" 2>/dev/null | cut -c1-160 | sed 's/^/  hang | /'
    sed 's/^/  hang |   kernel: /' /proc/"$p"/stack 2>/dev/null | head -n 8
    case $(cat /proc/"$p"/comm 2>/dev/null) in
      timeout|bash|sh|mpirun|orted|tail) ;;
      *) timeout 60 gdb -p "$p" -batch -nx -ex 'thread apply all bt 12' 2>/dev/null |
           grep -E '^(Thread|#)' | cut -c1-160 | sed 's/^/  hang |   /' ;;
    esac
  done
  dmesg 2>/dev/null | tail -n 15 | sed 's/^/  hang | dmesg: /'
}
show() { for f in "$@"; do echo "--- ${f##*/}"; tail -n 25 "$f" 2>/dev/null | cut -c1-160 | sed 's/^/  | /'; done; }
has() { [[ " $cases " == *" $1 "* ]]; }

exec 3>&1 # the suite's output, for hang reports from redirected cases
# Kernel errors (hung tasks, RCU stalls) onto the console, which run-vm
# prints when the VM has to be killed.
dmesg -n 4 2>/dev/null
export FI_PROVIDER_PATH=$dir/prov FI_UFAB_STATS=1
export HOME=$w OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# ------------------------------------------------------------------ setup
for t in fi_info fi_pingpong mpirun hpcc; do
  command -v "$t" >/dev/null || { fail "$t missing (apt-get install libfabric-bin openmpi-bin hpcc; scripts/setup.sh does)"; finish; }
done
[ -f "$dir/prov/libufab-fi.so" ] || { fail "no $dir/prov/libufab-fi.so"; finish; }
timeout 60 modprobe vfio-pci || { fail "modprobe vfio-pci"; finish; }
for b in "$nic1" "$nic2"; do
  timeout 60 "$ufab" bind "$b" >/dev/null || { fail "ufab bind $b"; finish; }
done
pass "both e1000e bound to vfio-pci ($nic1 as 10.0.0.1, $nic2 as 10.0.0.2), $(nproc) vCPU"

# stats_ok FILE DEVICE...: each DEVICE's "libufab-fi: stats" line in FILE
# shows RoCE frames sent and received. Sets stats_why otherwise.
stats_ok() {
  local f=$1 d line tx rx
  shift
  stats_why=
  for d in "$@"; do
    line=$(grep "^libufab-fi: stats $d: " "$f" | tail -n 1)
    tx=$(sed -n 's/.* tx_frames \([0-9]*\) .*/\1/p' <<<"$line")
    rx=$(sed -n 's/.* rx_roce \([0-9]*\) .*/\1/p' <<<"$line")
    if [ -z "$line" ]; then
      stats_why+=" no counters from $d;"
    elif [ "${tx:-0}" -eq 0 ] || [ "${rx:-0}" -eq 0 ]; then
      stats_why+=" $d sent $tx frames, received $rx RoCE frames;"
    fi
  done
  [ -z "$stats_why" ]
}
stats_of() { grep -h "^libufab-fi: stats " "$@" | sed 's/^libufab-fi: stats //' | tr '\n' ';'; }

# ---------------------------------------------------------------- fi_info
if has fi_info; then
  FI_UFAB_DEVICES="$dev1,$dev2" timeout 60 fi_info -p ufab -v >"$w/fi_info.out" 2>&1
  rc=$?
  why=
  for d in "$nic1" "$nic2"; do
    n=$(grep -c "name: $d\$" "$w/fi_info.out")
    [ "$n" -ge 2 ] || why+=" domain $d listed $n times (want MSG and DGRAM);"
  done
  for a in "fi_sockaddr_in://10.0.0.1:0" "fi_sockaddr_in://10.0.0.2:0" "fi_ufab_ud://10.0.0.1:0" "fi_ufab_ud://10.0.0.2:0"; do
    grep -q "$a" "$w/fi_info.out" || why+=" no $a;"
  done
  for t in FI_EP_MSG FI_EP_DGRAM; do
    grep -q "type: *$t" "$w/fi_info.out" || why+=" no $t;"
  done
  if [ "$rc" -eq 0 ] && [ -z "$why" ]; then
    pass "fi_info -p ufab lists both vfio NICs ($nic1, $nic2): MSG and DGRAM, their addresses"
  else
    fail "fi_info -p ufab (rc $rc):$why"; show "$w/fi_info.out"
  fi
fi

# --------------------------------------------------------------- pingpong
# pingpong LABEL PROVIDER OPTIONS...: server on NIC 1, client on NIC 2.
port=24000
pingpong() {
  local label=$1 prov=$2 crc src lines errs spid
  shift 2
  port=$((port + 1))
  rm -f "$w/server.out" "$w/client.out"
  FI_PROVIDER=$prov FI_UFAB_DEVICES=$dev1 bounded 120 "$w/server.out" fi_pingpong -B "$port" "$@" &
  server_pid=$!
  local end=$((SECONDS + 60))
  while [ -z "$(ss -Hltn "sport = :$port" 2>/dev/null)" ] && kill -0 "$server_pid" 2>/dev/null && [ "$SECONDS" -lt "$end" ]; do
    sleep 0.1
  done
  FI_PROVIDER=$prov FI_UFAB_DEVICES=$dev2 bounded 120 "$w/client.out" fi_pingpong -P "$port" "$@" 127.0.0.1
  crc=$?
  # The server ends by itself once the client has (or at its own limit).
  spid=$server_pid server_pid=
  wait "$spid"
  src=$?
  lines=$(grep -c '^[0-9]' "$w/client.out")
  # (No process substitution: the guest has no /dev/fd.)
  errs=$(grep -hv '^libufab-fi: stats' "$w/client.out" "$w/server.out" | grep -ci "error\|fail")
  if [ "$crc" -eq 0 ] && [ "$src" -eq 0 ] && [ "$lines" -gt 0 ] && [ "$errs" -eq 0 ]; then
    if stats_ok "$w/server.out" "$nic1" && stats_ok "$w/client.out" "$nic2"; then
      pass "fi_pingpong $label NIC 1 <-> NIC 2 ($lines sizes, data checked; $(stats_of "$w/server.out" "$w/client.out"))"
    else
      fail "fi_pingpong $label: passed, but the counters do not show the traffic on the NICs:$stats_why"
      show "$w/server.out" "$w/client.out"
    fi
  else
    fail "fi_pingpong $label: client rc $crc, server rc $src, $lines size lines"
    show "$w/server.out" "$w/client.out"
  fi
}
if has pingpong; then
  pingpong "-e msg" ufab -p ufab -e msg -c -I "$pp_iters"
  pingpong "-e dgram" ufab -p ufab -e dgram -c -I "$pp_iters"
  pingpong "-e rdm (ufab;ofi_rxm)" "ufab;ofi_rxm" -e rdm -c -I "$pp_iters"
  pingpong "-e rdm -m tagged (ufab;ofi_rxm)" "ufab;ofi_rxm" -e rdm -m tagged -c -I "$pp_iters"
fi

# -------------------------------------------------------------------- mpi
if has mpi; then
  cat >"$w/rank.sh" <<'EOS'
#!/bin/bash
# Rank r on NIC r+1 (10.0.0.r+1).
r=${OMPI_COMM_WORLD_RANK:?not started by mpirun}
bdf=UFAB_VM_NIC$((r + 1))_BDF
export FI_UFAB_DEVICES="${!bdf}@10.0.0.$((r + 1))"
exec "$@"
EOS
  chmod +x "$w/rank.sh"
  export FI_PROVIDER="ufab;ofi_rxm" UFAB_VM_NIC1_BDF="$nic1" UFAB_VM_NIC2_BDF="$nic2"
  mpi() { # LIMIT PROGRAM ARGS...: two ranks over ufab;ofi_rxm
    local limit=$1
    shift
    bounded "$limit" - mpirun --oversubscribe -np 2 -x FI_PROVIDER_PATH -x FI_PROVIDER -x FI_UFAB_STATS \
      -x UFAB_VM_NIC1_BDF -x UFAB_VM_NIC2_BDF \
      --mca pml cm --mca mtl ofi --mca mtl_ofi_provider_include "ufab;ofi_rxm" --mca btl self \
      --mca mtl_base_verbose 100 "$w/rank.sh" "$@"
  }
  ran_on() { # FILE: both ranks' OFI MTL on their NIC's ufab domain
    grep -q "mtl:ofi:provider: $nic1" "$1" && grep -q "mtl:ofi:provider: $nic2" "$1"
  }

  (cd "$w" && mpi 240 "$dir/mpi_check") >"$w/check.out" 2>&1
  rc=$?
  if [ "$rc" -eq 0 ] && grep -q "mpi_check: [0-9]* checks passed on 2 ranks" "$w/check.out"; then
    pass "mpi_check over ufab;ofi_rxm, rank 0 on NIC 1, rank 1 on NIC 2: $(grep -o '[0-9]* checks passed' "$w/check.out")"
  else
    fail "mpi_check (rc $rc)"; show "$w/check.out"
  fi
  if ran_on "$w/check.out" && stats_ok "$w/check.out" "$nic1" "$nic2"; then
    pass "mpi_check: both ranks' OFI MTL on their vfio NIC's domain, both NICs sent and received ($(stats_of "$w/check.out"))"
  else
    fail "mpi_check: OFI MTL domains or counters:$stats_why"; grep "mtl:ofi:provider\|libufab-fi: stats" "$w/check.out" | sed 's/^/  | /'
  fi

  cp "$dir/hpccinf.txt" "$w/hpccinf.txt"
  t0=$SECONDS
  (cd "$w" && mpi 600 hpcc) >"$w/hpcc.out" 2>&1
  rc=$?
  out=$w/hpccoutf.txt
  if [ "$rc" -eq 0 ] && [ -f "$out" ] && grep -q "End of HPC Challenge tests" "$out" &&
     grep -q "0 tests completed and failed residual checks" "$out" && ! grep -q "FAILED" "$out" &&
     grep -q "Solution Validates" "$out"; then
    pass "hpcc completed in $((SECONDS - t0)) s, its checks passed ($(grep -c 'PASSED' "$out") PASSED lines, $(grep -c 'completed and passed residual checks' "$out") residual checks passed, 0 FAILED)"
  else
    fail "hpcc (rc $rc, $((SECONDS - t0)) s)"; show "$w/hpcc.out"; [ -f "$out" ] && show "$out"
  fi
  if ran_on "$w/hpcc.out" && stats_ok "$w/hpcc.out" "$nic1" "$nic2"; then
    pass "hpcc: both ranks on their vfio NIC's domain, both NICs sent and received ($(stats_of "$w/hpcc.out"))"
  else
    fail "hpcc: OFI MTL domains or counters:$stats_why"; grep "mtl:ofi:provider\|libufab-fi: stats" "$w/hpcc.out" | sed 's/^/  | /'
  fi
  # Where hpcc's time went: its latency/bandwidth part (a fixed amount of
  # 2 MB ring exchanges) takes most of it under TCG.
  [ -f "$out" ] && grep -E "^Execution time \(wall clock\)|^ - for ring bandwidth" "$out" | sed 's/^/  hpcc LatencyBandwidth: /'
fi

finish
