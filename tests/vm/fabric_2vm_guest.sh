#!/usr/bin/env bash
# Runs inside the two VMs of tests/vm/suites/fabric.sh's second part, whose
# hubs are joined (run-vm --hub-link): Open MPI with one rank per VM, each
# rank on its VM's vfio-bound e1000e through ufab (pml cm, mtl ofi,
# "ufab;ofi_rxm"). In each VM:
#   NIC 1 (00:02.0)  vfio-pci, ufab's soft-RoCE: 10.0.0.1 (A), 10.0.0.2 (B)
#   NIC 2 (00:03.0)  kernel e1000e: 10.0.1.1 (A, "vm-a"), 10.0.1.2 (B,
#                    "vm-b"): Open MPI's launch and out-of-band traffic
# The guests have no sshd, so the launcher is Open MPI's own rsh launcher
# with tests/vm/fabric_rsh.sh as its agent (plm_rsh_agent): it sends the
# command to tests/vm/fabric_rshd.py in B, which runs it there (B's orted
# then connects back to mpirun in A over NIC 2).
#   ROLE=A  waits for B's server, runs mpirun -np 2 --host vm-a:1,vm-b:1
#           mpi_check (and hpcc with FAB_2VM_HPCC=1), checks, then tells B
#           to stop
#   ROLE=B  serves until A says so (or FAB_2VM_LIMIT seconds, 500)
# Environment: ROLE, UFAB_BIN, FAB_DIR (as tests/vm/fabric_guest.sh).
# Prints PASS/FAIL lines and "fabric_2vm ROLE: N passed, M failed".
set -uo pipefail
role=${ROLE:?ROLE=A or B}
ufab=${UFAB_BIN:?set UFAB_BIN to the ufab binary}
dir=${FAB_DIR:?set FAB_DIR to the staging directory}
limit=${FAB_2VM_LIMIT:-500}
here=$(cd "$(dirname "$0")" && pwd)
nic1=0000:00:02.0
nic2=0000:00:03.0
case $role in
  A) me=1 name=vm-a ;;
  B) me=2 name=vm-b ;;
  *) echo "ROLE must be A or B" >&2; exit 2 ;;
esac
prog="fabric_2vm $role"
w=$(mktemp -d)
rshd_pid=
cleanup() {
  if [ -n "$rshd_pid" ]; then kill "$rshd_pid" 2>/dev/null; wait "$rshd_pid" 2>/dev/null; fi
  rm -rf "$w"
}
trap cleanup EXIT
passed=0 failed=0
say() { printf '%s: %s\n' "$prog" "$*"; }
pass() { passed=$((passed + 1)); echo "PASS $role: $*"; }
fail() { failed=$((failed + 1)); echo "FAIL $role: $*"; }
finish() {
  echo "$prog: $passed passed, $failed failed"
  [ "$failed" -eq 0 ]
  exit
}
show() { for f in "$@"; do echo "--- ${f##*/}"; tail -n 30 "$f" 2>/dev/null | cut -c1-200 | sed 's/^/  | /'; done; }

# ------------------------------------------------------------------ setup
# Both VMs are "ufab-vm" otherwise; Open MPI tells nodes apart by name.
hostname "$name"
printf '10.0.1.1 vm-a\n10.0.1.2 vm-b\n' >>/etc/hosts
timeout 60 modprobe vfio-pci || { fail "modprobe vfio-pci"; finish; }
timeout 60 "$ufab" bind "$nic1" >/dev/null || { fail "ufab bind $nic1"; finish; }
ifname=$(ls "/sys/bus/pci/devices/$nic2/net" 2>/dev/null | head -n1)
[ -n "$ifname" ] || { fail "no kernel interface on $nic2"; finish; }
{ ip addr add "10.0.1.$me/24" dev "$ifname" && ip link set "$ifname" up; } || { fail "ip setup of $ifname"; finish; }
say "$name: ufab on $nic1 as 10.0.0.$me, $ifname 10.0.1.$me/24"

if [ "$role" = B ]; then
  timeout -k 5 "$limit" /usr/bin/python3 "$here/fabric_rshd.py" 10.0.1.2 2222 "$limit" >"$w/rshd.out" 2>&1 &
  rshd_pid=$!
  end=$((SECONDS + limit))
  while [ ! -e /tmp/fabric_2vm_done ] && kill -0 "$rshd_pid" 2>/dev/null && [ "$SECONDS" -lt "$end" ]; do
    sleep 1
  done
  if [ -e /tmp/fabric_2vm_done ]; then
    pass "served A's launcher until A was done ($(cat /tmp/fabric_2vm_done))"
  else
    fail "A never said it was done within $limit s"; show "$w/rshd.out"
  fi
  finish
fi

# ----------------------------------------------------------------- A: MPI
export FAB_RSH_PORT=2222
end=$((SECONDS + 240))
until timeout 10 "$here/fabric_rsh.sh" vm-b true >/dev/null 2>&1; do
  [ "$SECONDS" -lt "$end" ] || { fail "B's remote shell (fabric_rshd.py on 10.0.1.2:2222) did not answer within 240 s"; finish; }
  sleep 2
done
pass "B's remote shell answers ($(timeout 10 "$here/fabric_rsh.sh" vm-b hostname))"

cat >"$w/rank.sh" <<'EOS'
#!/bin/bash
# Rank r in VM r+1, on that VM's NIC 1 as 10.0.0.r+1.
r=${OMPI_COMM_WORLD_RANK:?not started by mpirun}
export FI_UFAB_DEVICES="0000:00:02.0@10.0.0.$((r + 1))"
exec "$@"
EOS
chmod +x "$w/rank.sh"
# B must see rank.sh too: its /tmp is its own, so B writes it there.
timeout 20 "$here/fabric_rsh.sh" vm-b "mkdir -p $w && cat >$w/rank.sh <<'EOS'
$(cat "$w/rank.sh")
EOS
chmod +x $w/rank.sh" || { fail "writing rank.sh on B"; finish; }
export FI_PROVIDER_PATH=$dir/prov FI_PROVIDER="ufab;ofi_rxm" FI_UFAB_STATS=1
export HOME=$w OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpi() { # LIMIT PROGRAM ARGS...
  local lim=$1
  shift
  timeout -k 10 "$lim" mpirun -np 2 --host vm-a:1,vm-b:1 --mca plm_rsh_agent "$here/fabric_rsh.sh" \
    --mca oob_tcp_if_include 10.0.1.0/24 -x FI_PROVIDER_PATH -x FI_PROVIDER -x FI_UFAB_STATS -x FAB_RSH_PORT \
    --mca pml cm --mca mtl ofi --mca mtl_ofi_provider_include "ufab;ofi_rxm" --mca btl self \
    --mca mtl_base_verbose 100 "$w/rank.sh" "$@"
}
stats_ok() { # FILE: both ranks' device counters show RoCE frames sent and received
  local n
  n=$(grep "^libufab-fi: stats $nic1: " "$1" | awk '$5 > 0 && $9 > 0' | wc -l)
  [ "$n" -eq 2 ]
}
(cd "$w" && mpi 300 "$dir/mpi_check") >"$w/check.out" 2>&1
rc=$?
if [ "$rc" -eq 0 ] && grep -q "mpi_check: [0-9]* checks passed on 2 ranks" "$w/check.out"; then
  pass "mpi_check across two VMs (rank 0 in A on 10.0.0.1, rank 1 in B on 10.0.0.2): $(grep -o '[0-9]* checks passed' "$w/check.out")"
else
  fail "mpi_check across two VMs (rc $rc)"; show "$w/check.out"
fi
# "[vm-a:00207] .../mtl_ofi_component.c:365: mtl:ofi:provider: 0000:00:02.0"
hosts=$(grep "^\[vm-[ab]:[0-9]*\] .*mtl:ofi:provider: $nic1\$" "$w/check.out" | cut -c2-5 | sort -u | tr '\n' ' ')
if [ "$hosts" = "vm-a vm-b " ] && stats_ok "$w/check.out"; then
  pass "mpi_check: one rank per VM on its NIC's ufab domain, both NICs sent and received ($(grep -h '^libufab-fi: stats' "$w/check.out" | sed 's/^libufab-fi: stats //' | tr '\n' ';'))"
else
  fail "mpi_check: ranks on '$hosts' (want vm-a vm-b), or the counters:"; grep "mtl:ofi:provider\|libufab-fi: stats" "$w/check.out" | sed 's/^/  | /'
fi

if [ "${FAB_2VM_HPCC:-0}" = 1 ]; then
  cp "$dir/hpccinf.txt" "$w/hpccinf.txt"
  t0=$SECONDS
  (cd "$w" && mpi 600 hpcc) >"$w/hpcc.out" 2>&1
  rc=$?
  out=$w/hpccoutf.txt
  if [ "$rc" -eq 0 ] && [ -f "$out" ] && grep -q "End of HPC Challenge tests" "$out" &&
     grep -q "0 tests completed and failed residual checks" "$out" && ! grep -q "FAILED" "$out" &&
     grep -q "Solution Validates" "$out"; then
    pass "hpcc across two VMs completed in $((SECONDS - t0)) s, its checks passed"
  else
    fail "hpcc across two VMs (rc $rc, $((SECONDS - t0)) s)"; show "$w/hpcc.out"; [ -f "$out" ] && show "$out"
  fi
fi

timeout 20 "$here/fabric_rsh.sh" vm-b "date +%T >/tmp/fabric_2vm_done" || say "could not tell B to stop (it stops after $limit s)"
finish
