#!/usr/bin/env bash
# cm_wire_check.sh: the rdma_cm suite's wire checks (tests/vm/suites/rdma_cm.sh).
# tshark dissects a capture of the hub and the CM MADs in it are checked:
# RoCEv2 (UDP 4791) UD packets to QP 1 that tshark's infiniband dissector
# decodes as MADs (infiniband.mad.*) and, for management class 0x07, as CM
# messages (infiniband.cm.req.*, .rep.*, .rtu.*, .rej.*, .dreq.*, .drsp.*
# for DREP; a REQ's rdma_cm header as infiniband.cm.req.ip_cm.*).
#
# Usage:
#   tests/vm/cm_wire_check.sh [--cases "client server reject ..."] PCAP
#   tests/vm/cm_wire_check.sh --selftest
#
# --cases names the guest cases that ran (tests/vm/rdma_cm_guest.sh's
# "CM_WIRE_CASES" line; default "client server reject"); what is expected
# follows from them:
#   always   every packet to QP 1 is a UD SEND only from QP 1 with Q_Key
#            0x80010000 carrying a 256-byte CM MAD (base version 1, class 0x07,
#            class version 2, method Send, attribute id REQ..APR 0x0010-0x001a;
#            tshark shows another id as "Unknown CM Attribute", no error); none is malformed or has expert
#            info of severity warning or more; every REQ's rdma_cm header is
#            IPv4 from the sender's address to the other side's, and its
#            service id is rdma_cm's TCP port space
#   client   (ufab active) REQ, RTU, DREQ from ufab; REP, DREP from rxe
#   server   (rxe active) REQ, RTU, DREQ from rxe; REP, DREP from ufab
#   either   REQ, REP, RTU, DREQ, DREP all on the wire
#   reject   a REJ with reason 8 (invalid service id) from each side
#   any      the first request packet (SEND, WRITE, READ, atomic) each
#            side sends on each connection has the PSN Linux's ib_cm gives
#            it: the passive side the REQ's starting PSN, the active side
#            the REP's (a direction without one is not counted); no
#            malformed frame in the whole capture
# ufab is 52:54:00:00:00:01 / 10.0.0.2, rxe 52:54:00:00:00:02 / 10.0.0.1
# (run-vm's NIC 1 and NIC 2).
#
# --selftest: runs the checks on captures that bazel-bin/tests/vm/cases/
# cm_pcap_gen writes (build it first) with ufab's own codec: the clean one
# must pass every check, and each defect (a REQ cut to 200 bytes, which
# tshark 4.0 shows as a plain UD SEND and not as malformed, a wrong Q_Key,
# a wrong class version, an unknown attribute id, a missing RTU, a wrong
# REJ reason, a wrong address in the rdma_cm header, a passive side that
# sends from its own REP's PSN) must fail the check
# meant to catch it. That shows the field names and filters work with the
# tshark installed here.
#
# Prints PASS/FAIL per check and ends with "cm_wire_check: N passed, M
# failed"; exit status 0 when all passed.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit

ufab_mac=52:54:00:00:00:01 ufab_ip=10.0.0.2
rxe_mac=52:54:00:00:00:02 rxe_ip=10.0.0.1
cases="client server reject"
selftest=0
while [ $# -gt 0 ]; do
  case $1 in
    --cases) [ $# -ge 2 ] || { echo "cm_wire_check: --cases needs a list" >&2; exit 2; }; cases=$2; shift 2 ;;
    --selftest) selftest=1; shift ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "cm_wire_check: unknown option '$1' (see --help)" >&2; exit 2 ;;
    *) break ;;
  esac
done

passed=0 failed=0
pass() { passed=$((passed + 1)); echo "PASS $*"; }
fail() { failed=$((failed + 1)); echo "FAIL $*"; }
finish() {
  echo "cm_wire_check: $passed passed, $failed failed"
  [ "$failed" -eq 0 ]
  exit
}
command -v tshark >/dev/null || { fail "tshark is missing (apt-get install tshark; scripts/setup.sh does)"; finish; }

# The heuristic payload dissectors of infiniband.payload (RPC-over-RDMA,
# SMB Direct, ...) off: rping's payloads are theirs to misread (see
# tests/vm/suites/rxe_interop.sh).
tshark_opts=(-n -o ip.check_checksum:TRUE -o udp.check_checksum:TRUE)
for h in rpcrdma_infiniband smb_direct_infiniband smcr_infiniband iser_infiniband nvme_rdma lnet_ib \
  eth_over_ib mellanox_eoib sdp_infiniband fc_infiniband; do
  tshark_opts+=(--disable-heuristic "$h")
done
terr=$(mktemp)
trap 'rm -f "$terr"' EXIT
# count FILTER: the number of frames of $pcap that match FILTER; fails with
# tshark's stderr in $terr when tshark does.
count() {
  local n
  n=$(tshark "${tshark_opts[@]}" -r "$pcap" -Y "$1" -T fields -e frame.number 2>"$terr" | wc -l)
  grep -v '^Running as user' "$terr" | grep -q . && return 1
  echo "$n"
}
show() { tshark "${tshark_opts[@]}" -r "$pcap" -Y "$1" 2>/dev/null | head -n 10 | sed 's/^/  | /'; }
terr_line() { grep -v '^Running as user' "$terr" | head -n 3 | tr '\n' ' '; }
# expect_none NAME FILTER: no frame matches FILTER.
expect_none() {
  local bad
  if ! bad=$(count "$2"); then fail "$1: tshark failed: $(terr_line)"
  elif [ "$bad" -ne 0 ]; then fail "$1: $bad frames"; show "$2"
  else pass "$1"; fi
}

cm="infiniband.bth.destqp == 1"
# attribute ids (IBTA table 104)
declare -A attr=([REQ]=0x0010 [REJ]=0x0012 [REP]=0x0013 [RTU]=0x0014 [DREQ]=0x0015 [DREP]=0x0016)
from_ufab="eth.src == $ufab_mac"
from_rxe="eth.src == $rxe_mac"

# The CM MADs, one line each: sender MAC, attribute id, REJ reason (one
# tshark pass; the per-message counts below read it).
load_table() {
  table=$(tshark "${tshark_opts[@]}" -r "$pcap" -Y "$cm" -T fields -e eth.src -e infiniband.mad.attributeid \
    -e infiniband.cm.rej.reason 2>"$terr")
  ! grep -v '^Running as user' "$terr" | grep -q .
}
# tcount MAC|any ATTR [REASON]: MADs in the table from MAC with attribute
# id ATTR (and REJ reason REASON).
tcount() {
  awk -F'\t' -v mac="$1" -v a="$2" -v r="${3:-}" \
    '(mac == "any" || $1 == mac) && $2 == a && (r == "" || $3 == r) { n++ } END { print n + 0 }' <<<"$table"
}
# sends WHO MSG...: each MSG was sent by WHO (ufab or rxe) at least once.
sends() {
  local who=$1 mac n m got=() missing=()
  shift
  [ "$who" = ufab ] && mac=$ufab_mac || mac=$rxe_mac
  for m in "$@"; do
    n=$(tcount "$mac" "${attr[$m]}")
    got+=("$m $n"); [ "$n" -gt 0 ] || missing+=("$m")
  done
  local IFS=,
  if [ "${#missing[@]}" -eq 0 ]; then pass "CM: $who sent ${got[*]}"
  else fail "CM: $who sent no ${missing[*]} (${got[*]})"; fi
}

run_checks() {
  local total n
  if ! total=$(count "$cm"); then fail "CM: tshark cannot read $pcap: $(terr_line)"; return; fi
  echo "cm_wire_check: $pcap: $(count frame) frames, $total to QP 1 (tshark $(tshark --version 2>/dev/null | sed -n '1s/.*) \([0-9.]*\).*/\1/p'))"
  if [ "$total" -eq 0 ]; then fail "CM: no packet to QP 1 in the capture"; return; fi

  # A MAD is 256 bytes: UDP length 8 + BTH 12 + DETH 8 + 256 + ICRC 4.
  # (tshark decodes a shorter one as a plain UD SEND, not as malformed.)
  expect_none "CM: every packet to QP 1 is a UD SEND only from QP 1, Q_Key 0x80010000, a 256-byte CM MAD (version 1, class 0x07, class version 2, method Send, a CM attribute id) (of $total)" \
    "$cm && !(udp.length == 288 && infiniband.bth.opcode == 100 && infiniband.deth.srcqp == 1 && infiniband.deth.q_key == 0x80010000 && infiniband.mad.baseversion == 1 && infiniband.mad.mgmtclass == 0x07 && infiniband.mad.classversion == 2 && infiniband.mad.method == 0x03 && infiniband.mad.attributeid in {0x0010..0x001a})"
  expect_none "CM: no packet to QP 1 is malformed or has expert info of severity warning or more (of $total)" \
    "$cm && (_ws.malformed || _ws.expert.severity >= warning)"
  expect_none "CM: every REQ carries rdma_cm's IPv4 header from its sender's address to the other side's, and a TCP port space service id" \
    "$cm && infiniband.mad.attributeid == 0x0010 && !(infiniband.cm.req.serviceid.prefix == 00:00:00:00:01 && infiniband.cm.req.serviceid.protocol == 0x06 && infiniband.cm.req.ip_cm.ipv == 4 && (($from_ufab && infiniband.cm.req.ip_cm.sip4 == $ufab_ip && infiniband.cm.req.ip_cm.dip4 == $rxe_ip) || ($from_rxe && infiniband.cm.req.ip_cm.sip4 == $rxe_ip && infiniband.cm.req.ip_cm.dip4 == $ufab_ip)))"

  local c have=() k got=() missing=()
  for c in $cases; do
    case $c in
      client|loss|ucmatose) have+=(client) ;;
    esac
    case $c in
      server|loss|ucmatose) have+=(server) ;;
    esac
  done
  if ! load_table; then fail "CM: tshark failed listing the CM MADs: $(terr_line)"; return; fi
  if [ "${#have[@]}" -gt 0 ]; then
    for k in REQ REP RTU DREQ DREP; do
      n=$(tcount any "${attr[$k]}")
      got+=("$k $n"); [ "$n" -gt 0 ] || missing+=("$k")
    done
    local IFS=,
    if [ "${#missing[@]}" -eq 0 ]; then pass "CM: REQ, REP, RTU, DREQ and DREP all on the wire (${got[*]})"
    else fail "CM: no ${missing[*]} on the wire (${got[*]})"; fi
    unset IFS
  fi
  if [[ " ${have[*]} " == *" client "* ]]; then
    sends ufab REQ RTU DREQ
    sends rxe REP DREP
  fi
  if [[ " ${have[*]} " == *" server "* ]]; then
    sends rxe REQ RTU DREQ
    sends ufab REP DREP
  fi
  if [[ " $cases " == *" reject "* ]]; then
    local who f mac
    for who in rxe ufab; do
      [ "$who" = ufab ] && f=$from_ufab mac=$ufab_mac || f=$from_rxe mac=$rxe_mac
      n=$(tcount "$mac" "${attr[REJ]}" 0x0008)
      if [ "$n" -gt 0 ]; then pass "CM: $who sent $n REJ with reason 8 (invalid service id)"
      else
        fail "CM: $who sent no REJ with reason 8 (invalid service id)"
        show "$cm && $f && infiniband.mad.attributeid == 0x0012"
      fi
    done
  fi
  psn_check
  expect_none "wire: no malformed frame in the whole capture" "_ws.malformed"
}

# The first request packet (SEND, WRITE, READ request, atomic, FLUSH) each
# side sends on a connection starts at the PSN Linux's ib_cm gives it: the
# passive side's at the REQ's starting PSN (cm_req_handler: sq_psn = the
# REQ's), the active side's at the REP's (cm_rep_handler). A connection is
# a REQ and the first REP naming its communication id; its packets are the
# first request packets to the active side's QPN (from the REQ) and to the
# passive side's (from the REP) after that REP. A direction that carried
# no request packet is not counted.
psn_check() {
  local rows res
  rows=$(tshark "${tshark_opts[@]}" -r "$pcap" -Y "infiniband" -T fields -E separator=/t -E occurrence=f \
    -e eth.src -e infiniband.bth.opcode -e infiniband.bth.destqp -e infiniband.bth.psn -e infiniband.mad.attributeid \
    -e infiniband.cm.req -e infiniband.cm.req.localqpn -e infiniband.cm.req.startpsn \
    -e infiniband.cm.rep.remotecommid -e infiniband.cm.rep.localqpn -e infiniband.cm.rep.startpsn 2>"$terr")
  if grep -v '^Running as user' "$terr" | grep -q .; then fail "RC: tshark failed: $(terr_line)"; return; fi
  res=$(awk -F'\t' -v um="$ufab_mac" '
    function num(x,   i, c, v) {  # decimal or 0x-hex, as tshark prints them
      if (x !~ /^0x/) return x + 0
      v = 0
      for (i = 3; i <= length(x); i++) { c = index("0123456789abcdef", tolower(substr(x, i, 1))) - 1; v = v * 16 + c }
      return v
    }
    function who(mac) { return mac == um ? "ufab" : "rxe" }
    {
      src = $1; op = $2 + 0; dqp = num($3); psn = num($4); attr = $5
      if (dqp == 1) {
        if (attr == "0x0010") { id = $6; if (!(id in rq)) { rq[id] = num($7); rp[id] = num($8); rw[id] = src } }
        else if (attr == "0x0013") {
          id = $9
          if ((id in rq) && !(id in seen)) {
            seen[id] = 1
            # passive -> active QPN from the REQ PSN; active -> passive QPN from the REP PSN
            want[rq[id]] = rp[id]; wsrc[rq[id]] = src; what[rq[id]] = "the REQ"
            want[num($10)] = num($11); wsrc[num($10)] = rw[id]; what[num($10)] = "the REP"
          }
        }
        next
      }
      req = (op <= 12) || (op >= 19 && op <= 23 && op != 21) || op == 28 || op == 29
      if (req && (dqp in want) && src == wsrc[dqp]) {
        n++
        if (psn == want[dqp]) ok++
        else bad = bad sprintf("%s to QP 0x%06x started at PSN 0x%06x, not at %s PSN 0x%06x; ", who(src), dqp, psn, what[dqp], want[dqp])
        delete want[dqp]
      }
    }
    END { printf "%d %d %s\n", n + 0, ok + 0, bad }' <<<"$rows")
  local n ok bad
  read -r n ok bad <<<"$res"
  if [ "$n" -eq 0 ]; then
    echo "cm_wire_check: no request packet after a REP: the RC starting PSNs are not checked"
  elif [ "$ok" -eq "$n" ]; then
    pass "RC: each side's first request packet on each connection starts at the PSN ib_cm gives it (the passive side the REQ's, the active side the REP's): $n of $n"
  else
    fail "RC: of $n first request packets, $((n - ok)) did not start at the PSN ib_cm gives them (passive: the REQ's starting PSN, active: the REP's): $bad"
  fi
}

if [ "$selftest" = 0 ]; then
  [ $# -eq 1 ] || { echo "usage: cm_wire_check.sh [--cases LIST] PCAP | --selftest" >&2; exit 2; }
  pcap=$1
  [ -s "$pcap" ] || { fail "CM: no capture in $pcap"; finish; }
  run_checks
  finish
fi

# ---------------------------------------------------------------- selftest
gen=bazel-bin/tests/vm/cases/cm_pcap_gen
[ -x "$gen" ] || { fail "selftest: $gen not built (bazel build //tests/vm/cases:cm_pcap_gen)"; finish; }
dir=$(mktemp -d)
trap 'rm -rf "$dir" "$terr"' EXIT
# defect, then a pattern of the check that must fail on it
selftests=(
  "none|"
  "truncated|a 256-byte CM MAD"
  "qkey|Q_Key 0x80010000"
  "class-version|class version 2"
  "attribute|a CM attribute id"
  "no-rtu|ufab sent no RTU"
  "rej-reason|rxe sent no REJ with reason 8"
  "cma-address|rdma_cm's IPv4 header"
  "psn|the PSN ib_cm gives"
)
st_pass=0 st_fail=0
for t in "${selftests[@]}"; do
  d=${t%%|*} want=${t#*|}
  pcap=$dir/$d.pcap
  if ! "$gen" "$pcap" "$d" 2>"$dir/gen.err"; then
    st_fail=$((st_fail + 1)); echo "FAIL selftest $d: cm_pcap_gen failed: $(head -n 3 "$dir/gen.err" | tr '\n' ' ')"; continue
  fi
  ( passed=0 failed=0; run_checks; echo "RESULT $passed $failed" ) >"$dir/$d.out" 2>&1
  read -r _ p f < <(grep '^RESULT ' "$dir/$d.out")
  if [ "$d" = none ]; then
    if [ "${f:-1}" -eq 0 ] && [ "${p:-0}" -ge 9 ]; then
      st_pass=$((st_pass + 1)); echo "PASS selftest: the clean capture passes all $p checks"
    else
      st_fail=$((st_fail + 1)); echo "FAIL selftest: the clean capture: $p passed, $f failed"; sed 's/^/  | /' "$dir/$d.out"
    fi
  else
    if [ "${f:-0}" -ge 1 ] && grep '^FAIL ' "$dir/$d.out" | grep -q -- "$want"; then
      st_pass=$((st_pass + 1))
      echo "PASS selftest: defect '$d' fails the check \"$want\" ($f failed: $(grep '^FAIL ' "$dir/$d.out" | cut -c6-80 | tr '\n' ';'))"
    else
      st_fail=$((st_fail + 1)); echo "FAIL selftest: defect '$d' did not fail the check \"$want\" ($p passed, $f failed)"; sed 's/^/  | /' "$dir/$d.out"
    fi
  fi
done
passed=$st_pass failed=$st_fail
finish
