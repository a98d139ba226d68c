#!/usr/bin/env bash
# VM suite: ufab's RoCEv2 transport against Linux soft-RoCE (rdma_rxe) with
# rdma-core's ibv_rc_pingpong on the other side, one VM boot. NIC 1 (e1000e,
# 00:02.0) is bound to vfio-pci and driven by `ufab pingpong` as 10.0.0.2;
# NIC 2 (e1000e, 00:03.0) stays with the kernel, carries 10.0.0.1/24 and
# rxe0. tests/vm/rxe_interop_guest.sh runs both directions (ufab server and
# ufab client) at -s 1, 4096 and 65536 (64 packets at MTU 1024), then with
# 2% loss towards the client. At its end, tests/vm/rxe_perftest_guest.sh
# runs perftest's eight RC tests (ib_write_lat ... ib_atomic_bw) against
# `ufab perf` in the same VM: each in both roles (ufab server with the
# perftest client, perftest server with the ufab client), 2 B to 8 MiB
# (write-bw at 1 MiB: 1024 packets a message; write-lat -a), two QPs, both
# atomics, and write-bw, read-bw and send-lat with 2% loss on the packets
# that carry the data: about 4 minutes more in the VM, and a capture of
# about 0.9 GB (830,000 frames) that tshark then reads for 1 to 2 minutes.
# Needs: bazel build //tools/ufab //examples:rdma_example //tests/vm/peers:verbs_example; ibverbs-utils, rdma-core,
# ibverbs-providers, iproute2, perftest, jq on the host (the guest runs the
# host's /).
# The hub is always recorded (run-vm --pcap, QEMU's filter-dump on NIC 1,
# which sees both NICs' frames) and, after the run, dissected on the host by
# tshark (scripts/setup.sh installs it): see "wire checks" below.
# UFAB_INTEROP_PCAP=FILE keeps that capture in FILE (otherwise a temp file);
# UFAB_INTEROP_ITERS, _SIZES, _LOSS, _CASES and _REPEAT, and UFAB_PERFTEST,
# UFAB_PERFTEST_CASES, _LIMIT, _VERBOSE and _TOTAL_LIMIT pass through to the
# guest scripts (see there). One perftest case alone, for example:
#   UFAB_INTEROP_CASES=none UFAB_INTEROP_LOSS=0 \
#     UFAB_PERFTEST_CASES='client - read-bw -s 65536 -n 200' tests/vm/suites/rxe_interop.sh
# Ends with "rxe_interop: N passed, M failed".
set -uo pipefail
if [ -n "${UFAB_INTEROP_PCAP:-}" ] && [ "${UFAB_INTEROP_PCAP#/}" = "$UFAB_INTEROP_PCAP" ]; then
  UFAB_INTEROP_PCAP=$PWD/$UFAB_INTEROP_PCAP  # relative to where the suite was started
fi
cd "$(dirname "$0")/../../.."
ufab=$PWD/bazel-bin/tools/ufab/ufab
out=$(mktemp)
tmp_pcap=
trap 'rm -f "$out" ${tmp_pcap:+"$tmp_pcap"}' EXIT

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

pcap_file=${UFAB_INTEROP_PCAP:-}
if [ -z "$pcap_file" ]; then
  tmp_pcap=$(mktemp --suffix=.pcap)
  pcap_file=$tmp_pcap
fi
pcap=(--pcap "$pcap_file")
envs=(--env "UFAB_BIN=$ufab")
for v in UFAB_INTEROP_ITERS UFAB_INTEROP_SIZES UFAB_INTEROP_LOSS UFAB_INTEROP_CASES UFAB_INTEROP_REPEAT \
  UFAB_PERFTEST UFAB_PERFTEST_CASES UFAB_PERFTEST_LIMIT UFAB_PERFTEST_VERBOSE UFAB_PERFTEST_TOTAL_LIMIT; do
  [ -z "${!v:-}" ] || envs+=(--env "$v=${!v}")
done
# Two vCPUs: ibv_rc_pingpong busy-polls its CQ, and on one vCPU it competes
# with ufab and with rxe's own work. perftest's tests busy-poll too.
# --timeout: the ping-pongs, then up to UFAB_PERFTEST_TOTAL_LIMIT (1200 s)
# of perftest, whose runs are each bounded; normally far less.
tests/vm/run-vm --timeout 1800 --mem 2048 --smp 2 --nic e1000e --nic e1000e "${pcap[@]}" "${envs[@]}" \
  -- tests/vm/rxe_interop_guest.sh 2>&1 | tee "$out"
rc=${PIPESTATUS[0]}

passed=$(grep -c '^PASS ' "$out")
failed=$(grep -c '^FAIL ' "$out")
if [ "$rc" -ne 0 ] && [ "$failed" -eq 0 ]; then failed=1; echo "FAIL the VM run exited with $rc"; fi

# ------------------------------------------------------------ wire checks
# tshark (4.0 on bookworm) dissects the capture: UDP port 4791 is its
# "infiniband" dissector (shown as RRoCE: BTH, extended headers, payload,
# ICRC). Options:
#   -o ip.check_checksum:TRUE -o udp.check_checksum:TRUE
#       verify the IPv4 header checksum (and a UDP checksum, where one is
#       sent: ufab and rxe both send 0, which tshark reports as "not
#       present", not as an error); off by default in tshark
#   --disable-heuristic ...
#       the heuristic payload sub-dissectors of infiniband.payload
#       (RPC-over-RDMA, SMB Direct, iSER, NVMe/RDMA, ...): the ping-pong
#       payload is opaque bytes, and e.g. RPCoRDMA's heuristic takes a -s 1
#       SEND for its own and reports it "Malformed" (seen on the first run)
# The ICRC: tshark 4.0's infiniband dissector only displays it
# (infiniband.invariant.crc, no status field, no expert info; a corrupted
# payload byte goes unnoticed), it does not verify it. The check below
# only asserts that every RoCEv2 frame has one (its length adds up to the
# BTH, the extended headers, the padded payload and 4 bytes of ICRC);
# the ICRC values themselves are verified by the receivers: ufab counts
# ICRC failures as parse errors (the guest script asserts 0) and rxe drops
# frames with a bad ICRC (the ping-pong would then fail).
ufab_mac=52:54:00:00:00:01  # NIC 1 (run-vm's default MAC), 10.0.0.2
rxe_mac=52:54:00:00:00:02   # NIC 2, rxe0's netdev, 10.0.0.1
min_frames=${UFAB_INTEROP_ITERS:-200}  # each case has each side send at least ITERS messages
tshark_opts=(-n -o ip.check_checksum:TRUE -o udp.check_checksum:TRUE)
for h in rpcrdma_infiniband smb_direct_infiniband smcr_infiniband iser_infiniband nvme_rdma lnet_ib \
  eth_over_ib mellanox_eoib sdp_infiniband fc_infiniband; do
  tshark_opts+=(--disable-heuristic "$h")
done
wire_names=(
  "wire: every IPv4 frame on the hub is UDP/4791 and dissects as RoCEv2 (InfiniBand BTH ... ICRC), ufab sends nothing but ARP and RoCEv2"
  "wire: no malformed frame"
  "wire: no expert info of severity warning or error, none about checksums (IPv4 header checksums verified)"
  "wire: RoCEv2 frames from ufab ($ufab_mac) and from rxe ($rxe_mac), at least $min_frames each"
)
wpass() { passed=$((passed + 1)); echo "PASS $*"; }
wfail() { failed=$((failed + 1)); echo "FAIL $*"; }
terr=$(mktemp)
# count FILTER: the number of frames of the capture that match FILTER, or
# an empty line and tshark's stderr in $terr when tshark failed.
count() {
  local n
  n=$(tshark "${tshark_opts[@]}" -r "$pcap_file" -Y "$1" -T fields -e frame.number 2>"$terr" | wc -l) || return 1
  echo "$n"
}
# show FILTER: the first frames that match it, one line each.
show() { tshark "${tshark_opts[@]}" -r "$pcap_file" -Y "$1" 2>/dev/null | head -n 10 | sed 's/^/  | /'; }
terr_line() { grep -v '^Running as user' "$terr" | head -n 3 | tr '\n' ' '; }
if ! command -v tshark >/dev/null; then
  for n in "${wire_names[@]}"; do wfail "$n: tshark is missing (run scripts/setup.sh)"; done
elif [ ! -s "$pcap_file" ]; then
  for n in "${wire_names[@]}"; do wfail "$n: no capture in $pcap_file"; done
elif ! total=$(count 'frame'); then
  for n in "${wire_names[@]}"; do wfail "$n: tshark cannot read $pcap_file: $(terr_line)"; done
else
  roce=$(count 'infiniband')
  echo "wire: $total frames in $pcap_file, $roce RoCEv2 (tshark $(tshark --version 2>/dev/null | sed -n '1s/.*) \([0-9.]*\).*/\1/p'))"

  # (a) RoCEv2 only, every frame whole: what is not RoCEv2 is ARP, and the
  # guest kernel's IPv6 multicast (MLD, ND) from NIC 2.
  f_a="(ip && !(udp.dstport == 4791 && infiniband)) || (udp.dstport == 4791 && !infiniband)"
  f_a="$f_a || (infiniband && !infiniband.invariant.crc) || (eth.src == $ufab_mac && !(arp || infiniband))"
  if ! bad=$(count "$f_a"); then wfail "${wire_names[0]}: tshark failed: $(terr_line)"
  elif [ "$bad" -ne 0 ] || [ "$roce" -eq 0 ]; then
    wfail "${wire_names[0]}: $bad frames are not ($roce RoCEv2 frames)"; show "$f_a"
  else wpass "${wire_names[0]} ($roce frames)"; fi

  # (b) No exception in any dissector (a field past the frame's end, a bad
  # length), and no expert info worth a warning: bad checksums are errors.
  f_b1="_ws.malformed"
  if ! bad=$(count "$f_b1"); then wfail "${wire_names[1]}: tshark failed: $(terr_line)"
  elif [ "$bad" -ne 0 ]; then wfail "${wire_names[1]}: $bad malformed frames"; show "$f_b1"
  else wpass "${wire_names[1]} (of $total)"; fi

  f_b2="_ws.expert.severity >= warning || _ws.expert.group == checksum"
  if ! bad=$(count "$f_b2"); then wfail "${wire_names[2]}: tshark failed: $(terr_line)"
  elif [ "$bad" -ne 0 ]; then
    wfail "${wire_names[2]}: $bad frames with such expert info"
    tshark "${tshark_opts[@]}" -r "$pcap_file" -q -z expert,warn 2>/dev/null | sed 's/^/  | /'
  else wpass "${wire_names[2]} (of $total)"; fi

  # Both directions on the wire.
  if ! from_ufab=$(count "infiniband && eth.src == $ufab_mac") || ! from_rxe=$(count "infiniband && eth.src == $rxe_mac"); then
    wfail "${wire_names[3]}: tshark failed: $(terr_line)"
  elif [ "$from_ufab" -lt "$min_frames" ] || [ "$from_rxe" -lt "$min_frames" ]; then
    wfail "${wire_names[3]}: $from_ufab from ufab, $from_rxe from rxe"
  else wpass "${wire_names[3]}: $from_ufab from ufab, $from_rxe from rxe"; fi
fi
rm -f "$terr"
[ -z "${UFAB_INTEROP_PCAP:-}" ] || echo "rxe_interop: the capture is in $pcap_file"
finish
