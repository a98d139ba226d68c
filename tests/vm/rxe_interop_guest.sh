#!/usr/bin/env bash
# Runs in the VM (tests/vm/suites/rxe_interop.sh boots it with two e1000e
# NICs on the hub): `ufab pingpong` on NIC 1 (00:02.0, vfio-pci, 10.0.0.2)
# against rdma-core's ibv_rc_pingpong on Linux soft-RoCE (rxe0 over NIC 2,
# 00:03.0, kernel e1000e, 10.0.0.1/24). The TCP exchange goes over loopback
# (127.0.0.1): the ufab NIC has no kernel netdev.
#
#   ufab server, ibv_rc_pingpong client  -s 1, 4096, 65536
#   ibv_rc_pingpong server, ufab client  -s 1, 4096, 65536
#   the same at 4096 and 65536 with 2% loss, each time on the packets
#   towards the client: ufab's SENDs to rxe (ufab server), everything rxe
#   sends (ufab client); see lossy() for why
#
# ibv_rc_pingpong runs with -g <index of ::ffff:10.0.0.1> (without -g it
# sends no GRH, which RoCE cannot carry), -m 1024 and, as client, -c.
# Prints "PASS ..."/"FAIL ..." per check, both sides' output, and ends with
# "rxe_interop_guest: N passed, M failed"; exit status 0 when all passed.
#
# Environment: UFAB_BIN (the ufab binary, required), UFAB_INTEROP_ITERS
# (default 200), UFAB_INTEROP_SIZES (default "1 4096 65536"),
# UFAB_INTEROP_LOSS (default 1: the lossy cases "ingress egress"; 0: none;
# or a list of modes: ingress, ingress-all, egress; see lossy()),
# UFAB_INTEROP_CASES (default "server client": which lossless directions
# run, ufab as server and/or as client), UFAB_INTEROP_REPEAT (default 1:
# times each case runs).
set -uo pipefail
ufab=${UFAB_BIN:?set UFAB_BIN to the ufab binary}
ufab_bdf=${UFAB_VM_NIC1_BDF:-0000:00:02.0}
kern_bdf=${UFAB_VM_NIC2_BDF:-0000:00:03.0}
iters=${UFAB_INTEROP_ITERS:-200}
sizes=${UFAB_INTEROP_SIZES:-1 4096 65536}
run_loss=${UFAB_INTEROP_LOSS:-1}
cases=${UFAB_INTEROP_CASES:-server client}
repeat=${UFAB_INTEROP_REPEAT:-1}
limit=150  # seconds for one side of one case; each ufab wait is --timeout 30 within it

w=$(mktemp -d)
passed=0 failed=0
say() { printf 'rxe_interop_guest: %s\n' "$*"; }
pass() { passed=$((passed + 1)); echo "PASS $*"; }
fail() { failed=$((failed + 1)); echo "FAIL $*"; }
finish() {
  echo "rxe_interop_guest: $passed passed, $failed failed"
  [ "$failed" -eq 0 ]
  exit
}
show() { # FILE LABEL
  echo "--- $2"
  sed 's/^/  | /' "$1" 2>/dev/null
}

# ------------------------------------------------------------------ setup
timeout 60 modprobe vfio-pci || { fail "modprobe vfio-pci"; finish; }
timeout 60 "$ufab" bind "$ufab_bdf" >/dev/null || { fail "ufab bind $ufab_bdf"; finish; }
ifname=$(ls "/sys/bus/pci/devices/$kern_bdf/net" 2>/dev/null | head -n1)
[ -n "$ifname" ] || { fail "no kernel interface on $kern_bdf"; finish; }
ip addr add 10.0.0.1/24 dev "$ifname" && ip link set "$ifname" up || { fail "ip setup of $ifname"; finish; }
# rxe computes its ICRC through the crypto API's "crc32", which this guest
# does not load on demand (see tests/vm/rxe_capture_guest.sh).
timeout 60 modprobe crc32_generic && timeout 60 modprobe rdma_rxe || { fail "modprobe crc32_generic rdma_rxe"; finish; }
timeout 20 rdma link add rxe0 type rxe netdev "$ifname" || { fail "rdma link add rxe0 netdev $ifname"; finish; }

# The RoCE v2 GID entry of ::ffff:10.0.0.1 (rxe adds it once the address and
# the link are up; allow 10 s).
gids=/sys/class/infiniband/rxe0/ports/1/gids
types=/sys/class/infiniband/rxe0/ports/1/gid_attrs/types
want=0000:0000:0000:0000:0000:ffff:0a00:0001
idx=
for _ in $(seq 100); do
  for f in "$gids"/*; do
    n=${f##*/}
    [ "$(cat "$f" 2>/dev/null)" = "$want" ] || continue
    [ "$(cat "$types/$n" 2>/dev/null)" = "RoCE v2" ] || continue
    idx=$n
    break
  done
  [ -z "$idx" ] || break
  sleep 0.1
done
if [ -z "$idx" ]; then
  fail "no RoCE v2 GID $want on rxe0 within 10 s"
  for f in "$gids"/*; do echo "  gid ${f##*/}: $(cat "$f" 2>/dev/null) $(cat "$types/${f##*/}" 2>/dev/null)"; done | grep -v ' 0000:0000:0000:0000:0000:0000:0000:0000' || true
  finish
fi
state=$(cat /sys/class/infiniband/rxe0/ports/1/state 2>/dev/null)
mtu=$(ibv_devinfo -d rxe0 2>/dev/null | sed -n 's/^[[:space:]]*active_mtu:[[:space:]]*//p' | head -n1)
pass "rxe0 on $ifname ($state, active MTU $mtu), GID index $idx = ::ffff:10.0.0.1; ufab on $ufab_bdf"

# Waits (bounded) until FILE has a line matching PATTERN or PID is gone.
wait_line() { # FILE PATTERN PID SECONDS
  local k
  for ((k = 0; k < $4 * 10; k++)); do
    grep -q -- "$2" "$1" 2>/dev/null && return 0
    kill -0 "$3" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}
wait_listen() { # PID SECONDS: until something listens on TCP 18515
  local k
  for ((k = 0; k < $2 * 10; k++)); do
    ss -ltn 2>/dev/null | grep -q ':18515 ' && return 0
    kill -0 "$1" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}

# check NAME SIZE (after urc and rrc are set): both exited 0, each printed its address
# lines naming the other's QPN and GID, and the two summary lines.
check() {
  local name=$1 size=$2 ok=1 why=() bytes uq rq
  bytes=$((size * iters * 2))
  [ "$urc" -eq 0 ] || { ok=0; why+=("ufab exited with $urc"); }
  [ "$rrc" -eq 0 ] || { ok=0; why+=("ibv_rc_pingpong exited with $rrc"); }
  uq=$(sed -n 's/^  local address:  LID 0x0000, QPN \(0x[0-9a-f]*\), .*GID ::ffff:10\.0\.0\.2$/\1/p' "$w/u.out")
  rq=$(sed -n 's/^  local address:  LID 0x0000, QPN \(0x[0-9a-f]*\), .*GID ::ffff:10\.0\.0\.1$/\1/p' "$w/r.out")
  if [ -z "$uq" ] || ! grep -q "^  remote address: LID 0x0000, QPN $uq, PSN 0x[0-9a-f]*, GID ::ffff:10\.0\.0\.2$" "$w/r.out"; then
    ok=0; why+=("ibv_rc_pingpong's remote address is not ufab's local one")
  fi
  if [ -z "$rq" ] || ! grep -q "^  remote address: LID 0x0000, QPN $rq, PSN 0x[0-9a-f]*, GID ::ffff:10\.0\.0\.1$" "$w/u.out"; then
    ok=0; why+=("ufab's remote address is not ibv_rc_pingpong's local one")
  fi
  local f
  for f in u r; do
    if ! grep -Eq "^$bytes bytes in [0-9.]+ seconds = [0-9.]+ Mbit/sec$" "$w/$f.out" ||
      ! grep -Eq "^$iters iters in [0-9.]+ seconds = [0-9.]+ usec/iter$" "$w/$f.out"; then
      ok=0; why+=("$([ $f = u ] && echo ufab || echo ibv_rc_pingpong) did not print the summary lines")
    fi
  done
  if grep -q 'invalid data' "$w/r.out"; then ok=0; why+=("ibv_rc_pingpong -c found invalid data"); fi
  # Every frame rxe sent passed ufab's parser (IPv4, UDP, BTH, ICRC, ...).
  if [ "$urc" -eq 0 ] && ! grep -q '^pingpong: transport: .*, parse errors 0,' "$w/u.err"; then
    ok=0; why+=("ufab counted parse errors")
  fi
  if [ "$ok" -eq 1 ]; then
    pass "$name: $(grep ' usec/iter$' "$w/u.out") (ufab), $(grep ' usec/iter$' "$w/r.out") (ibv_rc_pingpong)"
  else
    local IFS=';'
    fail "$name: ${why[*]}"
  fi
  show "$w/u.out" "ufab stdout"
  [ -s "$w/u.err" ] && show "$w/u.err" "ufab stderr"
  show "$w/r.out" "ibv_rc_pingpong stdout"
  [ -s "$w/r.err" ] && show "$w/r.err" "ibv_rc_pingpong stderr"
  if [ "$ok" -ne 1 ]; then
    echo "--- rxe counters"
    for c in /sys/class/infiniband/rxe0/ports/1/hw_counters/*; do
      v=$(cat "$c" 2>/dev/null) && [ "$v" != 0 ] && echo "  | ${c##*/} $v"
    done
    echo "--- ip neigh show dev $ifname"
    ip neigh show dev "$ifname" | sed 's/^/  | /'
    echo "--- dmesg (last 15)"
    dmesg | tail -n 15 | sed 's/^/  | /'
  fi
}

# Every case starts with the kernel not knowing ufab's MAC, so rxe's
# modify_qp to RTR must resolve it by ARP (within 1 s, in the kernel's
# rdma_addr_find_l2_eth_by_grh) while ufab is in the middle of the TCP
# exchange: ufab must answer ARP then too.
# Under netem the kernel's ARP request itself may be lost, and its 1 s would
# run out: the lossy egress cases pin ufab's MAC instead (pinned=1).
pinned=0
forget_neighbour() { [ "$pinned" = 1 ] || ip neigh flush dev "$ifname" >/dev/null 2>&1; }

# ufab server on the vfio NIC, ibv_rc_pingpong client over 127.0.0.1.
ufab_server() { # NAME SIZE
  local name=$1 size=$2 upid
  rm -f "$w"/u.* "$w"/r.*
  forget_neighbour
  timeout "$limit" "$ufab" pingpong "$ufab_bdf" --ip 10.0.0.2 -s "$size" -n "$iters" -m 1024 --timeout 30 \
    >"$w/u.out" 2>"$w/u.err" &
  upid=$!
  if ! wait_line "$w/u.err" 'waiting for a client' "$upid" 60; then
    wait "$upid"; urc=$?; rrc=125
    : >"$w/r.out"
    check "$name" "$size"
    return
  fi
  timeout "$limit" ibv_rc_pingpong -d rxe0 -g "$idx" -m 1024 -s "$size" -n "$iters" -c 127.0.0.1 \
    >"$w/r.out" 2>"$w/r.err"
  rrc=$?
  wait "$upid"
  urc=$?
  check "$name" "$size"
}

# ibv_rc_pingpong server, ufab client over 127.0.0.1.
ufab_client() { # NAME SIZE
  local name=$1 size=$2 rpid
  rm -f "$w"/u.* "$w"/r.*
  forget_neighbour
  timeout "$limit" ibv_rc_pingpong -d rxe0 -g "$idx" -m 1024 -s "$size" -n "$iters" >"$w/r.out" 2>"$w/r.err" &
  rpid=$!
  wait_listen "$rpid" 30 || say "ibv_rc_pingpong is not listening on 18515 after 30 s (the client retries while refused)"
  timeout "$limit" "$ufab" pingpong "$ufab_bdf" --ip 10.0.0.2 -s "$size" -n "$iters" -m 1024 --timeout 30 127.0.0.1 \
    >"$w/u.out" 2>"$w/u.err"
  urc=$?
  wait "$rpid"
  rrc=$?
  check "$name" "$size"
}

for c in $cases; do
  for s in $sizes; do
    for ((k = 0; k < repeat; k++)); do
      case $c in
        server) ufab_server "ufab server, ibv_rc_pingpong client, -s $s -n $iters" "$s" ;;
        client) ufab_client "ibv_rc_pingpong server, ufab client, -s $s -n $iters" "$s" ;;
      esac
    done
  done
done

# Loss, always on the packets towards the client: the client's ACK of the
# server's last message is the one packet nobody sends again (the client
# has exited), so losing it fails any ping-pong, ibv_rc_pingpong's against
# itself included. Towards the client, every loss is recovered by the
# server's retransmission or a sequence NAK.
#   ingress      ufab server: 2% of ufab's SENDs dropped as rxe0's netdev
#                receives them (tc ingress, gact netrand); ufab's ACKs are
#                spared, see below
#   ingress-all  the same with ufab's ACKs dropped too: rxe (6.12) then
#                stalls now and then (a client QP that never sends again),
#                so it is not in the default set
#   egress       ufab client: 2% of everything rxe0's netdev sends (netem)
# Why ACKs are spared: when the ACK of a multi-packet message is lost, rxe
# times out and sends the message again; ufab answers each duplicate packet
# with an ACK of the last PSN it received (as rxe's responder does, C9-105).
# The first such ACK moves rxe's comp.psn past the message while the WQE is
# being resent (wqe_state_processing: rxe_comp.c COMPST_WRITE_SEND ->
# UPDATE_COMP), the second completes the WQE (check_psn: "retried packet",
# COMPST_COMP_ACK) under the requester's feet, and in the run that showed
# it rxe's requester never sent again.
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
  esac
}
case $run_loss in
  0) loss_modes= ;;
  1) loss_modes="ingress egress" ;;
  *) loss_modes=$run_loss ;;
esac
if [ -n "$loss_modes" ]; then
  for m in sch_netem sch_ingress cls_matchall cls_u32 act_gact; do timeout 30 modprobe "$m" || say "modprobe $m failed"; done
fi
for mode in $loss_modes; do
  case $mode in
    ingress|ingress-all)
      if lossy "$mode"; then
        for s in $sizes; do
          [ "$s" -ge 4096 ] || continue
          for ((k = 0; k < repeat; k++)); do
            ufab_server "2% loss ufab->rxe ($mode), ufab server, ibv_rc_pingpong client, -s $s -n $iters" "$s"
          done
        done
        echo "--- tc -s filter show dev $ifname ingress"; tc -s filter show dev "$ifname" ingress | sed 's/^/  | /'
      else
        fail "could not set up 2% $mode loss on $ifname (sch_ingress, cls_u32, cls_matchall, act_gact)"
      fi
      ;;
    egress)
      if ip neigh replace 10.0.0.2 lladdr "${UFAB_VM_NIC1_MAC:-52:54:00:00:00:01}" dev "$ifname" nud permanent &&
        pinned=1 && lossy egress; then
        for s in $sizes; do
          [ "$s" -ge 4096 ] || continue
          for ((k = 0; k < repeat; k++)); do
            ufab_client "2% loss rxe->ufab (egress), ibv_rc_pingpong server, ufab client, -s $s -n $iters" "$s"
          done
        done
        echo "--- tc -s qdisc show dev $ifname"; tc -s qdisc show dev "$ifname" | sed 's/^/  | /'
      else
        fail "could not set up netem loss 2% on $ifname (sch_netem)"
      fi
      if [ "$pinned" = 1 ]; then ip neigh del 10.0.0.2 dev "$ifname"; pinned=0; fi
      ;;
    *) fail "UFAB_INTEROP_LOSS: unknown mode '$mode' (ingress, ingress-all, egress)" ;;
  esac
  lossy off
done

echo "--- rxe0 hw_counters"
for c in /sys/class/infiniband/rxe0/ports/1/hw_counters/*; do
  v=$(cat "$c" 2>/dev/null) && [ "$v" != 0 ] && echo "  | ${c##*/} $v"
done
rm -rf "$w"
finish
