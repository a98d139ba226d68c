#!/usr/bin/env bash
# VM suite: ufab's connection manager against the kernel's rdma_cm (IB CM
# over RoCEv2, Linux soft-RoCE), with rdmacm-utils' rping (and ucmatose)
# on the other side, one VM boot. NIC 1 (e1000e, 00:02.0) is bound to
# vfio-pci and driven by `ufab rping` as 10.0.0.2; NIC 2 (e1000e, 00:03.0)
# stays with the kernel, carries 10.0.0.1/24 and rxe0.
# tests/vm/rdma_cm_guest.sh runs the cases (see there): the kernel's tools
# against themselves over rxe loopback; ufab rping -c against rping -s and
# rping -c against ufab rping -s at -S 64 and 65535 with validation; rping
# -c against ufab rping -s --param mtu=9000 (e1000e jumbo frames, active
# MTU 4096) settling on the kernel's 1024; a REJ
# each way when nothing listens on the port; ucmatose against
# `ufab cmatose` both ways (SKIP where ufab has no cmatose); 2% loss on rxe0's netdev
# (netem) with rping -C 50 both ways.
# Needs: bazel build //tools/ufab //tests/vm/cases:cm_pcap_gen; rdmacm-utils, rdma-core,
# ibverbs-providers, iproute2, tshark on the host (scripts/setup.sh; the
# guest runs the host's /).
# The hub is recorded (run-vm --pcap) and, after the run, dissected on the
# host by tshark: see "wire checks" below.
# UFAB_CM_PCAP=FILE keeps that capture in FILE (otherwise a temp file);
# UFAB_CM_CASES, _COUNT, _SIZES, _LOSS_COUNT and _LOSS_SIZE pass through to
# the guest script. The kernel-only cases alone, for example:
#   UFAB_CM_CASES=kernel tests/vm/suites/rdma_cm.sh
# Ends with "rdma_cm: N passed, M failed".
set -uo pipefail
if [ -n "${UFAB_CM_PCAP:-}" ] && [ "${UFAB_CM_PCAP#/}" = "$UFAB_CM_PCAP" ]; then
  UFAB_CM_PCAP=$PWD/$UFAB_CM_PCAP  # relative to where the suite was started
fi
cd "$(dirname "$0")/../../.." || exit
ufab=$PWD/bazel-bin/tools/ufab/ufab
out=$(mktemp)
tmp_pcap=
trap 'rm -f "$out" ${tmp_pcap:+"$tmp_pcap"}' EXIT

passed=0 failed=0
finish() {
  echo "rdma_cm: $passed passed, $failed failed"
  [ "$failed" -eq 0 ]
  exit
}
[ -x "$ufab" ] || { echo "FAIL ufab not built (bazel build //tools/ufab)"; failed=1; finish; }
[ -x bazel-bin/tests/vm/cases/cm_pcap_gen ] || {
  echo "FAIL cm_pcap_gen not built (bazel build //tests/vm/cases:cm_pcap_gen)"; failed=1; finish;
}
command -v rping >/dev/null || {
  echo "FAIL rping missing (apt-get install rdmacm-utils; scripts/setup.sh does)"; failed=1; finish;
}

pcap_file=${UFAB_CM_PCAP:-}
if [ -z "$pcap_file" ]; then
  tmp_pcap=$(mktemp --suffix=.pcap)
  pcap_file=$tmp_pcap
fi
envs=(--env "UFAB_BIN=$ufab")
for v in UFAB_CM_CASES UFAB_CM_COUNT UFAB_CM_SIZES UFAB_CM_LOSS_COUNT UFAB_CM_LOSS_SIZE; do
  [ -z "${!v:-}" ] || envs+=(--env "$v=${!v}")
done
# Two vCPUs: ufab polls, and rxe's work and rping's threads run beside it.
# --timeout: the cases are each bounded (120 s a side, 300 s under loss);
# normally the VM's part takes about 90 s, the whole suite about 2 minutes.
tests/vm/run-vm --timeout 1500 --mem 2048 --smp 2 --nic e1000e --nic e1000e --pcap "$pcap_file" "${envs[@]}" \
  -- tests/vm/rdma_cm_guest.sh 2>&1 | tee "$out"
rc=${PIPESTATUS[0]}

passed=$(grep -c '^PASS ' "$out")
failed=$(grep -c '^FAIL ' "$out")
if [ "$rc" -ne 0 ] && [ "$failed" -eq 0 ]; then failed=1; echo "FAIL the VM run exited with $rc"; fi

# ------------------------------------------------------------ wire checks
# tshark's infiniband dissector (UDP port 4791, "RRoCE") decodes a UD
# packet to QP 1 as a MAD: the common header (infiniband.mad.*: class 0x07
# is the CM) and, for the CM, each message's fields (infiniband.cm.req.*,
# .rep.*, .rtu.*, .rej.*, .dreq.*, .drsp.* for DREP), a REQ's rdma_cm
# private-data header included (infiniband.cm.req.ip_cm.*). The checks run
# tests/vm/cm_wire_check.sh on the capture; it prints its PASS/FAIL lines,
# which count here. What they expect depends on the cases that put CM on
# the wire (the guest's "CM_WIRE_CASES" line). First its --selftest: the
# same checks on captures built with ufab's codec (cm_pcap_gen), a clean
# one and eight with one defect each, so a failure below is the capture's,
# not a tshark whose fields are named otherwise (about 15 s).
wire_check() { # ARGS...: run cm_wire_check.sh, count its PASS/FAIL lines here
  local wout wrc n_pass n_fail
  wout=$(mktemp)
  tests/vm/cm_wire_check.sh "$@" 2>&1 | tee "$wout"
  wrc=${PIPESTATUS[0]}
  n_pass=$(grep -c '^PASS ' "$wout")
  n_fail=$(grep -c '^FAIL ' "$wout")
  passed=$((passed + n_pass)) failed=$((failed + n_fail))
  [ "$wrc" -eq 0 ] || [ "$n_fail" -ne 0 ] || { failed=$((failed + 1)); echo "FAIL cm_wire_check.sh $* exited with $wrc"; }
  rm -f "$wout"
}
wire=$(sed -n 's/^CM_WIRE_CASES *//p' "$out" | tail -n 1)
if [ -z "$wire" ]; then
  echo "SKIP wire checks: no case that puts CM MADs on the hub ran (see the guest's lines: no 'ufab rping', UFAB_CM_CASES='${UFAB_CM_CASES:-}', or the guest stopped early)"
else
  wire_check --selftest
  wire_check --cases "$wire" "$pcap_file"
fi
[ -z "${UFAB_CM_PCAP:-}" ] || echo "rdma_cm: the capture is in $pcap_file"
finish
