#!/usr/bin/env bash
# VM suite for ufab's RoCEv2 parser against Linux soft-RoCE (rdma_rxe), one
# VM boot: tests/vm/rxe_capture_guest.sh makes rxe send RC SENDs (one
# 64-byte, one 4096-byte = 4 packets at MTU 1024) from NIC 1 to a peer that
# never answers, run-vm --pcap records them, and the host-side
# pcap_roce_check parses every frame (ICRC included) and checks opcodes,
# PSNs, lengths, the UDP source port rule and the IPv4 header.
# Needs: bazel build //tests/vm/cases:pcap_roce_check; ibverbs-utils,
# rdma-core, ibverbs-providers, iproute2 on the host (the guest runs the
# host's /). Ends with "rxe_wire: N passed, M failed".
set -euo pipefail
cd "$(dirname "$0")/../../.."
check_bin=$PWD/bazel-bin/tests/vm/cases/pcap_roce_check
# The pcap must be where the host can read it after the VM: not /tmp of the
# guest, and run-vm wants a path visible to the guest's cwd anyway.
work=$(mktemp -d "${TMPDIR:-/var/tmp}/rxe_wire.XXXXXX")
trap 'rm -rf -- "$work"' EXIT
pcap=$work/rxe.pcap
out=$work/guest.out

passed=0 failed=0
pass() { passed=$((passed + 1)); echo "PASS $*"; }
fail() { failed=$((failed + 1)); echo "FAIL $*"; }
finish() {
  echo "rxe_wire: $passed passed, $failed failed"
  [ "$failed" -eq 0 ]
  exit
}

[ -x "$check_bin" ] || { fail "pcap_roce_check not built (bazel build //tests/vm/cases:pcap_roce_check)"; finish; }
command -v ibv_rc_pingpong >/dev/null || { fail "ibv_rc_pingpong missing (apt-get install ibverbs-utils)"; finish; }

rc=0
tests/vm/run-vm --timeout 240 --nic e1000e --nic e1000e --pcap "$pcap" \
  -- tests/vm/rxe_capture_guest.sh 2>&1 | tee "$out" || rc=$?
if [ "$rc" -eq 0 ]; then pass "VM: rxe up, two rc_pingpong clients sent"; else fail "VM run exited with $rc"; fi

ttl=$(sed -n 's/^RXE_TTL=\([0-9]*\)$/\1/p' "$out" | head -n1)
runs=()
while read -r size rqpn cqpn cpsn; do
  runs+=("$size:$rqpn:$cqpn:$cpsn")
done < <(sed -n 's/^RXE_RUN size=\([0-9]*\) rqpn=\(0x[0-9a-f]*\) client_qpn=\(0x[0-9a-f]*\) client_psn=\(0x[0-9a-f]*\) .*/\1 \2 \3 \4/p' "$out" | head -n 8)
if [ "${#runs[@]}" -eq 2 ] && [ -n "$ttl" ]; then
  pass "guest reported 2 runs (${runs[*]}) and TTL $ttl"
else
  fail "guest reported ${#runs[@]} runs (want 2), TTL '${ttl}'"
  finish
fi
# The client's own GID in its message must be ::ffff:10.99.0.1.
if [ "$(grep -c '^RXE_RUN .* client_gid=00000000000000000000ffff0a630001$' "$out")" -eq 2 ]; then
  pass "client GIDs are ::ffff:10.99.0.1"
else
  fail "client GIDs are not ::ffff:10.99.0.1"
fi

[ -s "$pcap" ] || { fail "no pcap written"; finish; }
crc=0
timeout 120 "$check_bin" "$pcap" "$ttl" "${runs[@]}" >"$work/check.out" 2>&1 || crc=$?
cat "$work/check.out"
n_pass=$(grep -c '^PASS ' "$work/check.out" || true)
n_fail=$(grep -c '^FAIL ' "$work/check.out" || true)
passed=$((passed + n_pass)) failed=$((failed + n_fail))
if [ "$crc" -ne 0 ] && [ "$n_fail" -eq 0 ]; then fail "pcap_roce_check exited with $crc"; fi
finish
