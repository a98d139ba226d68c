#!/usr/bin/env bash
# VM suite: the libfabric provider (libufab-fi.so, docs/fabric.md) over
# vfio-bound NICs, one VM boot: two e1000e on the VM's QEMU hub, both
# bound to vfio-pci, each driven by ufab's soft-RoCE in its own process
# (NIC 1 as 10.0.0.1, NIC 2 as 10.0.0.2). tests/vm/fabric_guest.sh runs
# `fi_info -p ufab` (both listed), fi_pingpong -e msg, -e dgram and -e rdm
# ("ufab;ofi_rxm", msg and tagged) NIC 1 <-> NIC 2 with data checks, then
# Open MPI with two ranks, one per NIC (pml cm, mtl ofi, "ufab;ofi_rxm"):
# tests/mpi/mpi_check.c and hpcc (N=400, 1 x 2 grid) with their checks.
# Every process prints its device's counters at the end (FI_UFAB_STATS=1),
# and each case checks that both NICs sent and received RoCE frames: a
# vfio-bound e1000e only reaches the other through the hub.
# Needs: bazel build //fabric:libufab-fi.so //tools/ufab; libfabric-bin,
# openmpi-bin, libopenmpi-dev, hpcc (scripts/setup.sh installs them; the
# guest runs the host's /). FAB_CASES ("fi_info pingpong mpi") and
# FAB_PP_ITERS (20) pass through to the guest. Then the two-VM part
# below. Measured: 3 min 48 s in all at a host load of 2 to 5 (the first
# VM 3 min, hpcc 106 s of it, mostly its latency/bandwidth part; the two
# VMs 45 s); at a load of 10 to 15 hpcc alone took over 7 minutes.
# Ends with "fabric: N passed, M failed".
set -uo pipefail
cd "$(dirname "$0")/../../.." || exit
ufab=$PWD/bazel-bin/tools/ufab/ufab
so=$PWD/bazel-bin/fabric/libufab-fi.so
passed=0 failed=0
finish() {
  echo "fabric: $passed passed, $failed failed"
  [ "$failed" -eq 0 ]
  exit
}
[ -x "$ufab" ] || { echo "FAIL ufab not built (bazel build //tools/ufab)"; failed=1; finish; }
[ -f "$so" ] || { echo "FAIL libufab-fi.so not built (bazel build //fabric:libufab-fi.so; it needs libfabric-dev)"; failed=1; finish; }
for t in fi_info fi_pingpong mpirun mpicc hpcc; do
  command -v "$t" >/dev/null || {
    echo "FAIL $t missing (apt-get install libfabric-bin openmpi-bin libopenmpi-dev hpcc; scripts/setup.sh does)"; failed=1; finish;
  }
done
[ -f /usr/share/doc/hpcc/examples/_hpccinf.txt ] || { echo "FAIL no /usr/share/doc/hpcc/examples/_hpccinf.txt (hpcc's example input)"; failed=1; finish; }

# The staging directory must be visible in the guest: not under /tmp (the
# guest's own tmpfs).
stage=$(mktemp -d "${TMPDIR:-/var/tmp}/fabric_suite.XXXXXX")
[ "${stage#/tmp/}" = "$stage" ] || stage=$(mktemp -d /var/tmp/fabric_suite.XXXXXX)
out=$stage/guest.out
trap 'rm -rf -- "$stage"' EXIT
mkdir -p "$stage/prov"
cp "$so" "$stage/prov/libufab-fi.so"
if ! mpicc -O2 -o "$stage/mpi_check" tests/mpi/mpi_check.c 2>"$stage/mpicc.err"; then
  echo "FAIL mpicc tests/mpi/mpi_check.c"; sed 's/^/  | /' "$stage/mpicc.err"; failed=1; finish
fi
# hpcc's example input with a 1 x 2 process grid and N=400 (HPL; PTRANS
# takes N/2): small enough for TCG.
sed -e 's/^2            Ps/1            Ps/' -e 's/^1000         Ns/400          Ns/' \
  /usr/share/doc/hpcc/examples/_hpccinf.txt >"$stage/hpccinf.txt"
grep -q '^400 ' "$stage/hpccinf.txt" && grep -q '^1 .*Ps' "$stage/hpccinf.txt" ||
  { echo "FAIL hpcc's example input is not the one this suite edits (N=1000, 2 x 2)"; failed=1; finish; }

envs=(--env "UFAB_BIN=$ufab" --env "FAB_DIR=$stage")
for v in FAB_CASES FAB_PP_ITERS; do
  [ -z "${!v:-}" ] || envs+=(--env "$v=${!v}")
done
# Two vCPUs: one per rank (each polls its NIC). --timeout: every step in
# the guest is bounded (120 s per fi_pingpong side, 240 s mpi_check,
# 600 s hpcc).
tests/vm/run-vm --timeout 1800 --mem 2048 --smp 2 --nic e1000e --nic e1000e "${envs[@]}" \
  -- tests/vm/fabric_guest.sh 2>&1 | tee "$out"
rc=${PIPESTATUS[0]}
passed=$(grep -c '^PASS ' "$out")
failed=$(grep -c '^FAIL ' "$out")
if [ "$rc" -ne 0 ] && [ "$failed" -eq 0 ]; then failed=1; echo "FAIL the VM run exited with $rc"; fi

# ------------------------------------------------------- two VMs, one rank each
# Two VMs whose hubs are joined (run-vm --hub-link), one MPI rank in each
# on its VM's vfio NIC; Open MPI's rsh launcher reaches the second VM
# through tests/vm/fabric_rsh.sh and tests/vm/fabric_rshd.py over a kernel
# NIC (tests/vm/fabric_2vm_guest.sh). FAB_2VM=0 leaves this part out;
# FAB_2VM_HPCC=1 adds hpcc to it.
if [ "${FAB_2VM:-1}" = 1 ]; then
  sock=$stage/hub.sock
  common=(--timeout 700 --mem 1024 --smp 1 --env "UFAB_BIN=$ufab" --env "FAB_DIR=$stage")
  [ -z "${FAB_2VM_HPCC:-}" ] || common+=(--env "FAB_2VM_HPCC=$FAB_2VM_HPCC")
  tests/vm/run-vm "${common[@]}" --hub-link "listen=$sock" --env ROLE=B \
    --nic e1000e:52:54:00:0b:00:01 --nic e1000e:52:54:00:0b:00:02 \
    -- tests/vm/fabric_2vm_guest.sh >"$stage/b.out" 2>&1 &
  pb=$!
  tests/vm/run-vm "${common[@]}" --hub-link "connect=$sock" --env ROLE=A \
    --nic e1000e:52:54:00:0a:00:01 --nic e1000e:52:54:00:0a:00:02 \
    -- tests/vm/fabric_2vm_guest.sh 2>&1 | tee "$stage/a.out"
  rca=${PIPESTATUS[0]}
  wait "$pb"
  rcb=$?
  sed 's/^/  VM B | /' "$stage/b.out"
  for r in a b; do
    passed=$((passed + $(grep -c '^PASS ' "$stage/$r.out")))
    failed=$((failed + $(grep -c '^FAIL ' "$stage/$r.out")))
  done
  if [ "$rca" -ne 0 ] && ! grep -q '^FAIL ' "$stage/a.out"; then failed=$((failed + 1)); echo "FAIL VM A exited with $rca"; fi
  if [ "$rcb" -ne 0 ] && ! grep -q '^FAIL ' "$stage/b.out"; then failed=$((failed + 1)); echo "FAIL VM B exited with $rcb"; fi
fi
finish
