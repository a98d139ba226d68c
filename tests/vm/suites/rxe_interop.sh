#!/usr/bin/env bash
# VM suite: ufab's RoCEv2 transport against Linux soft-RoCE (rdma_rxe) with
# rdma-core's ibv_rc_pingpong on the other side, one VM boot. NIC 1 (e1000e,
# 00:02.0) is bound to vfio-pci and driven by `ufab pingpong` as 10.0.0.2;
# NIC 2 (e1000e, 00:03.0) stays with the kernel, carries 10.0.0.1/24 and
# rxe0. tests/vm/rxe_interop_guest.sh runs both directions (ufab server and
# ufab client) at -s 1, 4096 and 65536 (64 packets at MTU 1024), then with
# 2% loss towards the client.
# Needs: bazel build //tools/ufab; ibverbs-utils, rdma-core,
# ibverbs-providers, iproute2 on the host (the guest runs the host's /).
# UFAB_INTEROP_PCAP=FILE records the hub (run-vm --pcap) for diagnosis;
# UFAB_INTEROP_ITERS, _SIZES, _LOSS, _CASES and _REPEAT pass through to
# the guest script (see there).
# Ends with "rxe_interop: N passed, M failed".
set -uo pipefail
cd "$(dirname "$0")/../../.."
ufab=$PWD/bazel-bin/tools/ufab/ufab
out=$(mktemp)
trap 'rm -f "$out"' EXIT

passed=0 failed=0
finish() {
  echo "rxe_interop: $passed passed, $failed failed"
  [ "$failed" -eq 0 ]
  exit
}
[ -x "$ufab" ] || { echo "FAIL ufab not built (bazel build //tools/ufab)"; failed=1; finish; }
command -v ibv_rc_pingpong >/dev/null || {
  echo "FAIL ibv_rc_pingpong missing (apt-get install ibverbs-utils; scripts/setup.sh does)"; failed=1; finish;
}

pcap=()
[ -z "${UFAB_INTEROP_PCAP:-}" ] || pcap=(--pcap "$UFAB_INTEROP_PCAP")
envs=(--env "UFAB_BIN=$ufab")
for v in UFAB_INTEROP_ITERS UFAB_INTEROP_SIZES UFAB_INTEROP_LOSS UFAB_INTEROP_CASES UFAB_INTEROP_REPEAT; do
  [ -z "${!v:-}" ] || envs+=(--env "$v=${!v}")
done
# Two vCPUs: ibv_rc_pingpong busy-polls its CQ, and on one vCPU it competes
# with ufab and with rxe's own work.
tests/vm/run-vm --timeout 900 --mem 2048 --smp 2 --nic e1000e --nic e1000e "${pcap[@]}" "${envs[@]}" \
  -- tests/vm/rxe_interop_guest.sh 2>&1 | tee "$out"
rc=${PIPESTATUS[0]}

passed=$(grep -c '^PASS ' "$out")
failed=$(grep -c '^FAIL ' "$out")
if [ "$rc" -ne 0 ] && [ "$failed" -eq 0 ]; then failed=1; echo "FAIL the VM run exited with $rc"; fi
finish
