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
#   sends (ufab client); "Loss" below says why
#
# ibv_rc_pingpong runs with -g <index of ::ffff:10.0.0.1> (without -g it
# sends no GRH, which RoCE cannot carry), -m 1024 and, as client, -c.
#
# Then, in the same VM, tests/vm/rxe_perftest_guest.sh (its own process,
# given UFAB_BIN, RXE_GID_INDEX, KERN_IF and a work dir W): perftest's
# ib_write_lat ... ib_atomic_bw on rxe0 against `ufab perf`, every test in
# both roles, 2 B to 8 MiB, then write-bw, read-bw and send-lat with 2% loss.
# Its PASS/FAIL lines go to stdout with the others and count here too.
# Then tests/vm/rxe_verbs_guest.sh: examples/rdma_example (ufab) against
# tests/vm/peers/verbs_example (libibverbs on rxe0), both roles, every
# operation including WRITE_WITH_IMM checked byte for byte (UFAB_VERBS=0
# skips it).
#
# Prints "PASS ..."/"FAIL ..." per check, both sides' output, and ends with
# "rxe_interop_guest: N passed, M failed"; exit status 0 when all passed.
# The helpers both scripts share (lossy() and the rest) are in
# tests/vm/rxe_guest_lib.sh.
#
# Environment: UFAB_BIN (the ufab binary, required), UFAB_INTEROP_ITERS
# (default 200), UFAB_INTEROP_SIZES (default "1 4096 65536"),
# UFAB_INTEROP_LOSS (default 1: the lossy cases "ingress egress"; 0: none;
# or a list of modes: ingress, ingress-all, egress; see lossy()),
# UFAB_INTEROP_CASES (default "server client": which lossless directions
# run, ufab as server and/or as client; "none": none), UFAB_INTEROP_REPEAT
# (default 1: times each case runs), UFAB_PERFTEST (default 1; 0: skip
# rxe_perftest_guest.sh), UFAB_PERFTEST_TOTAL_LIMIT (default 1200: seconds
# for all of it), and rxe_perftest_guest.sh's own UFAB_PERFTEST_CASES,
# _LIMIT and _VERBOSE (see there).
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

here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
w=$(mktemp -d)
passed=0 failed=0
prog=rxe_interop_guest
# say, pass, fail, finish, show, wait_line, wait_listen, rxe_diag,
# forget_neighbour, pin_neighbour, lossy, ...
# shellcheck source=tests/vm/rxe_guest_lib.sh
. "$here/rxe_guest_lib.sh"

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
    # Data packets per packet needed as ufab saw them (its transport line).
    local spn
    spn=$(sed -n 's/^pingpong: transport: .*, sent\/needed \([0-9.]*\).*/\1/p' "$w/u.err" | tail -n 1)
    pass "$name: $(grep ' usec/iter$' "$w/u.out") (ufab), $(grep ' usec/iter$' "$w/r.out") (ibv_rc_pingpong); sent/needed ${spn:--}"
  else
    local IFS=';'
    fail "$name: ${why[*]}"
  fi
  show "$w/u.out" "ufab stdout"
  [ -s "$w/u.err" ] && show "$w/u.err" "ufab stderr"
  show "$w/r.out" "ibv_rc_pingpong stdout"
  [ -s "$w/r.err" ] && show "$w/r.err" "ibv_rc_pingpong stderr"
  [ "$ok" -eq 1 ] || rxe_diag
}

# Every case starts with the kernel not knowing ufab's MAC (forget_neighbour
# in rxe_guest_lib.sh says why).

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
# server's retransmission or a sequence NAK. The modes (lossy() in
# rxe_guest_lib.sh):
#   ingress      ufab server: 2% of ufab's SENDs dropped as rxe0's netdev
#                receives them; ufab's ACKs are spared (the lib says why)
#   ingress-all  the same with ufab's ACKs dropped too: rxe (6.12) then
#                stalls now and then, so it is not in the default set
#   egress       ufab client: 2% of everything rxe0's netdev sends (netem)
case $run_loss in
  0) loss_modes= ;;
  1) loss_modes="ingress egress" ;;
  *) loss_modes=$run_loss ;;
esac
[ -z "$loss_modes" ] || lossy_modules
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
      if pin_neighbour && lossy egress; then
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
      unpin_neighbour
      ;;
    *) fail "UFAB_INTEROP_LOSS: unknown mode '$mode' (ingress, ingress-all, egress)" ;;
  esac
  lossy off
done

# perftest's tests against `ufab perf`, in this VM as it is now: its own
# process, its PASS/FAIL lines counted here as the host suite counts them.
# The `timeout` bounds it as a whole (each of its runs is bounded too), so
# this script still ends with its count.
if [ "${UFAB_PERFTEST:-1}" != 0 ]; then
  mkdir -p "$w/perftest"
  UFAB_BIN=$ufab RXE_GID_INDEX=$idx KERN_IF=$ifname W=$w/perftest \
    timeout -k 10 "${UFAB_PERFTEST_TOTAL_LIMIT:-1200}" "$here/rxe_perftest_guest.sh" | tee "$w/perftest.log"
  prc=${PIPESTATUS[0]}
  n_pass=$(grep -c '^PASS ' "$w/perftest.log")
  n_fail=$(grep -c '^FAIL ' "$w/perftest.log")
  passed=$((passed + n_pass)) failed=$((failed + n_fail))
  [ "$prc" -eq 0 ] || [ "$n_fail" -ne 0 ] || fail "rxe_perftest_guest.sh exited with $prc"
fi

# ufab's rdma_example against the same program over libibverbs on rxe0
# (tests/vm/peers/verbs_example.cc), both roles: SEND, WRITE,
# WRITE_WITH_IMM, READ and both atomics, every result checked by both.
if [ "${UFAB_VERBS:-1}" != 0 ]; then
  mkdir -p "$w/verbs"
  RXE_GID_INDEX=$idx KERN_IF=$ifname W=$w/verbs \
    timeout -k 10 300 "$here/rxe_verbs_guest.sh" | tee "$w/verbs.log"
  vrc=${PIPESTATUS[0]}
  n_pass=$(grep -c '^PASS ' "$w/verbs.log")
  n_fail=$(grep -c '^FAIL ' "$w/verbs.log")
  passed=$((passed + n_pass)) failed=$((failed + n_fail))
  [ "$vrc" -eq 0 ] || [ "$n_fail" -ne 0 ] || fail "rxe_verbs_guest.sh exited with $vrc"
fi

echo "--- rxe0 hw_counters"
rxe_counters
rm -rf "$w"
finish
