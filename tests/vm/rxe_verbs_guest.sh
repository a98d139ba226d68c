#!/usr/bin/env bash
# Runs in the VM, after tests/vm/rxe_interop_guest.sh's setup (same boot):
# ufab's examples/rdma_example on NIC 1 (vfio-pci, 10.0.0.2) against
# tests/vm/peers/verbs_example, the same program over libibverbs on Linux
# soft-RoCE (rxe0, 10.0.0.1), in both roles. The client does SEND,
# RDMA_WRITE, RDMA_READ, RDMA_WRITE_WITH_IMM, FETCH_AND_ADD and CMP_AND_SWP
# against the server's buffer, and both sides check every result: the data
# read back, the bytes written, the immediate and its receive completion,
# the atomics' old values and the counter. (perftest checks no data and has
# no WRITE_WITH_IMM.) The TCP exchange goes over 127.0.0.1; the server
# listens on a port the kernel picks and prints it.
#
# Interface, all through the environment:
#   RXE_GID_INDEX  rxe0's GID index of ::ffff:10.0.0.1, type RoCE v2
#                  (required): verbs_example's --gid-index
#   RDMA_EXAMPLE_BIN   ufab's rdma_example (default: bazel-bin/examples/
#                  rdma_example of this checkout)
#   VERBS_EXAMPLE_BIN  verbs_example (default: bazel-bin/tests/vm/peers/
#                  verbs_example of this checkout)
#   W              a directory for the runs' output (default: a new
#                  temporary one, removed at the end)
#   KERN_IF        the kernel interface under rxe0 (default: the one rxe0's
#                  GID RXE_GID_INDEX belongs to): its neighbour entry of
#                  10.0.0.2 is flushed before each run, so rxe resolves
#                  ufab's MAC by ARP while ufab is in the exchange
#   UFAB_VM_NIC1_BDF  ufab's NIC (default 0000:00:02.0), on vfio-pci;
#                  ufab is 10.0.0.2 on it
#   UFAB_VERBS_CASES  ufab's roles to run (default "server client")
#   UFAB_VERBS_LIMIT  seconds for one side of one run (default 120); each
#                  wait inside the programs is --timeout 30
#   UFAB_VERBS_VERBOSE=1  show both sides' output after passing runs too
#                  (always shown after a failing one)
# It expects NIC 1 bound to vfio-pci and rxe0 up on 10.0.0.1/24, as
# rxe_interop_guest.sh leaves them. Prints "PASS ..." or "FAIL ..." per run
# and ends with "rxe_verbs_guest: N passed, M failed"; exit status 0 when
# all passed.
#
# Standalone, in `tests/vm/run-vm --interactive --smp 2 --nic e1000e --nic
# e1000e` after that setup (rxe_interop_guest.sh with UFAB_INTEROP_CASES=none
# UFAB_INTEROP_LOSS=0 UFAB_PERFTEST=0 does it; its first PASS line names
# the GID index):
#   RXE_GID_INDEX=1 tests/vm/rxe_verbs_guest.sh
set -uo pipefail
here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
root=$(cd -- "$here/../.." && pwd)
ufab_bin=${RDMA_EXAMPLE_BIN:-$root/bazel-bin/examples/rdma_example}
verbs_bin=${VERBS_EXAMPLE_BIN:-$root/bazel-bin/tests/vm/peers/verbs_example}
ufab_bdf=${UFAB_VM_NIC1_BDF:-0000:00:02.0}
cases=${UFAB_VERBS_CASES:-server client}
limit=${UFAB_VERBS_LIMIT:-120}
verbose=${UFAB_VERBS_VERBOSE:-0}
ops="SEND, RDMA_WRITE, RDMA_READ, RDMA_WRITE_WITH_IMM, FETCH_AND_ADD, CMP_AND_SWP"

passed=0 failed=0
prog=rxe_verbs_guest
# say, pass, fail, finish, show, wait_line, rxe_diag, forget_neighbour
# shellcheck source=tests/vm/rxe_guest_lib.sh
. "$here/rxe_guest_lib.sh"

idx=${RXE_GID_INDEX:-}
[[ $idx =~ ^[0-9]+$ ]] || { fail "RXE_GID_INDEX: expected rxe0's GID index of ::ffff:10.0.0.1, got '$idx'"; finish; }
ifname=${KERN_IF:-$(cat "/sys/class/infiniband/rxe0/ports/1/gid_attrs/ndevs/$idx" 2>/dev/null)}
[ -n "$ifname" ] || { fail "no KERN_IF given and no netdev for rxe0's GID index $idx"; finish; }
for b in "$ufab_bin" "$verbs_bin"; do
  [ -x "$b" ] || { fail "$b is missing (bazel build //examples:rdma_example //tests/vm/peers:verbs_example)"; finish; }
done
own_w=0
if [ -z "${W:-}" ]; then W=$(mktemp -d) && own_w=1; fi
mkdir -p "$W" || { fail "cannot create W=$W"; finish; }

# One side's program, bounded: u is ufab's rdma_example, v verbs_example.
side() { # u|v ARGS...
  local who=$1
  shift
  case $who in
    u) timeout "$limit" "$ufab_bin" --device "$ufab_bdf" --ip 10.0.0.2 --timeout 30 "$@" ;;
    v) timeout "$limit" "$verbs_bin" --device rxe0 --gid-index "$idx" --timeout 30 "$@" ;;
  esac
}

# One run: the server in the background, the client once the server prints
# its port. SERVER and CLIENT are u or v (see side).
run_pair() { # NAME SERVER CLIENT
  local name=$1 s=$2 c=$3 spid port
  local -A label=([u]=rdma_example [v]=verbs_example)
  rm -f "$W"/u.* "$W"/v.*
  forget_neighbour
  : >"$W/$c.out"; : >"$W/$c.err"
  side "$s" --listen 0 >"$W/$s.out" 2>"$W/$s.err" &
  spid=$!
  crc=125
  if wait_line "$W/$s.out" 'listening on TCP port' "$spid" 60; then
    port=$(sed -n 's/.*listening on TCP port \([0-9][0-9]*\).*/\1/p' "$W/$s.out")
    side "$c" --connect "127.0.0.1:$port" >"$W/$c.out" 2>"$W/$c.err"
    crc=$?
  else
    echo "the client did not run: the server printed no port" >"$W/$c.err"
  fi
  wait "$spid"
  src=$?
  check "$name" "$s" "$c" "${label[$s]}" "${label[$c]}"
}

# check NAME SERVER CLIENT SERVER_LABEL CLIENT_LABEL (after src and crc are
# set): both exited 0 with "all N steps OK" (5 for the server, 7 for the
# client), and each one's step 1 names the other's QP.
check() {
  local name=$1 s=$2 c=$3 sl=$4 cl=$5 ok=1 why=() sq cq sq_l sq_r sq_ip cq_l cq_r cq_ip
  local -A ip_of=([u]=10.0.0.2 [v]=10.0.0.1)
  [ "$src" -eq 0 ] || { ok=0; why+=("the server ($sl) exited with $src"); }
  [ "$crc" -eq 0 ] || { ok=0; why+=("the client ($cl) exited with $crc"); }
  [ "$(tail -n1 "$W/$s.out")" = "$sl: all 5 steps OK" ] || { ok=0; why+=("the server did not print all 5 steps OK"); }
  [ "$(tail -n1 "$W/$c.out")" = "$cl: all 7 steps OK" ] || { ok=0; why+=("the client did not print all 7 steps OK"); }
  local re='^[a-z_]*: step 1/[0-9] OK: QP \(0x[0-9a-f]*\) connected to QP \(0x[0-9a-f]*\) at \(10\.0\.0\.[12]\) .*'
  sq=$(sed -n "s|$re|\1 \2 \3|p" "$W/$s.out")
  cq=$(sed -n "s|$re|\1 \2 \3|p" "$W/$c.out")
  read -r sq_l sq_r sq_ip <<<"$sq"
  read -r cq_l cq_r cq_ip <<<"$cq"
  if [ "$ok" -eq 1 ] && { [ -z "$sq_l" ] || [ "$sq_l" != "$cq_r" ] || [ "$cq_l" != "$sq_r" ] ||
    [ "$sq_ip" != "${ip_of[$c]}" ] || [ "$cq_ip" != "${ip_of[$s]}" ]; }; then
    ok=0; why+=("step 1: the two QPs do not name each other: server '$sq', client '$cq' (local, remote, remote IP)")
  fi
  if [ "$ok" -eq 1 ]; then
    pass "$name: $ops, every result checked on both sides (QPs $sq_l, $cq_l)"
  else
    local IFS=';'
    fail "$name: ${why[*]}"
  fi
  if [ "$ok" -eq 0 ] || [ "$verbose" = 1 ]; then
    show "$W/$s.out" "server ($sl) stdout"
    [ -s "$W/$s.err" ] && show "$W/$s.err" "server ($sl) stderr"
    show "$W/$c.out" "client ($cl) stdout"
    [ -s "$W/$c.err" ] && show "$W/$c.err" "client ($cl) stderr"
  fi
  [ "$ok" -eq 1 ] || rxe_diag
}

for c in $cases; do
  case $c in
    server) run_pair "rdma_example: ufab server, verbs_example (rxe0) client" u v ;;
    client) run_pair "rdma_example: verbs_example (rxe0) server, ufab client" v u ;;
    *) fail "UFAB_VERBS_CASES: unknown case '$c' (server, client)" ;;
  esac
done
[ "$own_w" = 0 ] || rm -rf "$W"
finish
