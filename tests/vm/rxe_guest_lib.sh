# Helpers of the rxe_interop suite's guest scripts (rxe_interop_guest.sh,
# rxe_perftest_guest.sh) and of scripts/demo-guest.sh, sourced, never run.
# The sourcing script sets `prog` (its name, for say and finish) before
# using them, `passed=0 failed=0` before pass and fail, and `ifname` (the
# kernel interface under rxe0, 10.0.0.1) before forget_neighbour,
# pin_neighbour, lossy and rxe_diag. ufab is 10.0.0.2 on NIC 1.
# shellcheck shell=bash disable=SC2154  # prog, ifname: the sourcing script's

say() { printf '%s: %s\n' "$prog" "$*"; }
pass() { passed=$((passed + 1)); echo "PASS $*"; }
fail() { failed=$((failed + 1)); echo "FAIL $*"; }
finish() {
  echo "$prog: $passed passed, $failed failed"
  [ "$failed" -eq 0 ]
  exit
}
show() { # FILE LABEL
  echo "--- $2"
  sed 's/^/  | /' "$1" 2>/dev/null
}

# Waits until FILE has a line matching PATTERN, or PID is gone, or SECONDS
# have passed (by the clock: under TCG a poll round takes far longer than
# its 0.1 s of sleep).
wait_line() { # FILE PATTERN PID SECONDS
  local end=$((SECONDS + $4))
  while :; do
    grep -q -- "$2" "$1" 2>/dev/null && return 0
    kill -0 "$3" 2>/dev/null && [ "$SECONDS" -lt "$end" ] || return 1
    sleep 0.1
  done
}
wait_listen() { # PID SECONDS [PORT]: until something listens on TCP PORT (default 18515), or as wait_line
  local end=$((SECONDS + $2)) port=${3:-18515}
  while :; do
    [ -n "$(ss -Hltn "sport = :$port" 2>/dev/null)" ] && return 0
    kill -0 "$1" 2>/dev/null && [ "$SECONDS" -lt "$end" ] || return 1
    sleep 0.1
  done
}

# rxe_setup IFNAME ADDR: the kernel side of a VM's rxe test. Gives IFNAME
# ADDR/24 and brings it up, loads rdma_rxe, adds rxe0 on IFNAME and waits
# (10 s) for rxe0's RoCE v2 GID of ::ffff:ADDR, whose index (perftest's -x,
# ibv_rc_pingpong's -g) it leaves in rxe_gid_index. Every step is bounded.
# On failure it says which step failed (say) and returns 1. (Used by
# scripts/demo-guest.sh; rxe_interop_guest.sh and
# tests/bench/rdma_vs_rxe_guest.sh still do the same steps inline.)
# shellcheck disable=SC2034  # rxe_gid_index: for the sourcing script
rxe_setup() { # IFNAME ADDR
  local ifn=$1 addr=$2 want f n a b c d
  rxe_gid_index=
  IFS=. read -r a b c d <<<"$addr"
  want=$(printf '0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x' "$a" "$b" "$c" "$d") ||
    { say "rxe_setup: '$addr' is not an IPv4 address"; return 1; }
  [ -e "/sys/class/net/$ifn" ] || { say "rxe_setup: no kernel interface $ifn"; return 1; }
  { ip addr add "$addr/24" dev "$ifn" && ip link set "$ifn" up; } || { say "rxe_setup: ip setup of $ifn ($addr/24) failed"; return 1; }
  # rxe computes its ICRC through the crypto API's "crc32", which this
  # guest does not load on demand (see tests/vm/rxe_capture_guest.sh).
  { timeout 60 modprobe crc32_generic && timeout 60 modprobe rdma_rxe; } || { say "rxe_setup: modprobe crc32_generic rdma_rxe failed"; return 1; }
  timeout 20 rdma link add rxe0 type rxe netdev "$ifn" || { say "rxe_setup: rdma link add rxe0 type rxe netdev $ifn failed"; return 1; }
  # rxe adds the GID once the address and the link are up.
  for _ in $(seq 100); do
    for f in /sys/class/infiniband/rxe0/ports/1/gids/*; do
      n=${f##*/}
      [ "$(cat "$f" 2>/dev/null)" = "$want" ] || continue
      [ "$(cat "/sys/class/infiniband/rxe0/ports/1/gid_attrs/types/$n" 2>/dev/null)" = "RoCE v2" ] || continue
      rxe_gid_index=$n
      return 0
    done
    sleep 0.1
  done
  say "rxe_setup: no RoCE v2 GID $want (::ffff:$addr) on rxe0 within 10 s"
  return 1
}

rxe_counters() { # rxe0's non-zero hw_counters, one "  | name value" line each
  local c v
  for c in /sys/class/infiniband/rxe0/ports/1/hw_counters/*; do
    v=$(cat "$c" 2>/dev/null) && [ "$v" != 0 ] && echo "  | ${c##*/} $v"
  done
}
# What to look at after a failed case.
rxe_diag() {
  echo "--- rxe counters"
  rxe_counters
  echo "--- ip neigh show dev $ifname"
  ip neigh show dev "$ifname" | sed 's/^/  | /'
  echo "--- dmesg: errors and warnings (last 10)"
  dmesg --level=emerg,alert,crit,err,warn 2>/dev/null | tail -n 10 | sed 's/^/  | /'
  echo "--- dmesg (last 15)"
  dmesg | tail -n 15 | sed 's/^/  | /'
}

# Every case starts with the kernel not knowing ufab's MAC, so rxe's
# modify_qp to RTR must resolve it by ARP (within 1 s, in the kernel's
# rdma_addr_find_l2_eth_by_grh) while ufab is in the middle of the TCP
# exchange: ufab must answer ARP then too.
# Under netem the kernel's ARP request itself may be lost, and its 1 s would
# run out: the lossy egress cases pin ufab's MAC instead (pinned=1).
pinned=0
forget_neighbour() { [ "$pinned" = 1 ] || ip neigh flush dev "$ifname" >/dev/null 2>&1; }
pin_neighbour() {
  ip neigh replace 10.0.0.2 lladdr "${UFAB_VM_NIC1_MAC:-52:54:00:00:00:01}" dev "$ifname" nud permanent && pinned=1
}
unpin_neighbour() {
  if [ "$pinned" = 1 ]; then ip neigh del 10.0.0.2 dev "$ifname"; pinned=0; fi
}

# 2% loss on the kernel side, in one of these modes:
#   ingress      2% of what rxe0's netdev receives (ufab's packets) dropped
#                (tc ingress, gact netrand), ufab's ACKs spared, see below
#   ingress-all  the same with ufab's ACKs dropped too: rxe (6.12) then
#                stalls now and then (a requester QP that never sends
#                again), so no default case uses it
#   egress       2% of everything rxe0's netdev sends (netem); pin_neighbour
#                first (netem drops the kernel's ARP requests too)
#   off          none
# Why ACKs are spared: when the ACK of a multi-packet message is lost, rxe
# times out and sends the message again; ufab answers each duplicate packet
# with an ACK of the last PSN it received (as rxe's responder does, C9-105).
# The first such ACK moves rxe's comp.psn past the message while the WQE is
# being resent (wqe_state_processing: rxe_comp.c COMPST_WRITE_SEND ->
# UPDATE_COMP), the second completes the WQE (check_psn: "retried packet",
# COMPST_COMP_ACK) under the requester's feet, and in the run that showed
# it rxe's requester never sent again.
lossy_modules() {
  local m
  for m in sch_netem sch_ingress cls_matchall cls_u32 act_gact; do timeout 30 modprobe "$m" || say "modprobe $m failed"; done
}
lossy() { # MODE: off, ingress, ingress-all or egress
  tc qdisc del dev "$ifname" root 2>/dev/null
  tc qdisc del dev "$ifname" ingress 2>/dev/null
  case $1 in
    egress) tc qdisc add dev "$ifname" root netem loss 2% ;;
    ingress)
      # BTH opcode 0x11 (RC ACKNOWLEDGE) at IPv4 offset 28 (20-byte IPv4
      # header, 8-byte UDP header): passed before the random drop.
      tc qdisc add dev "$ifname" ingress &&
        tc filter add dev "$ifname" ingress prio 1 protocol ip u32 match ip protocol 17 0xff \
          match ip dport 4791 0xffff match u8 0x11 0xff at 28 action ok &&
        tc filter add dev "$ifname" ingress prio 2 protocol ip matchall action gact pass random netrand drop 50 ;;
    ingress-all)
      tc qdisc add dev "$ifname" ingress &&
        tc filter add dev "$ifname" ingress protocol ip matchall action gact pass random netrand drop 50 ;;
    off) return 0 ;;
    *) return 1 ;;
  esac
}
# tc's statistics of what lossy MODE set up, as tc prints them.
lossy_stats() { # MODE
  case $1 in
    egress) tc -s qdisc show dev "$ifname" ;;
    ingress*) tc -s filter show dev "$ifname" ingress ;;
  esac
}
