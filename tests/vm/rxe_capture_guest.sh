#!/usr/bin/env bash
# Runs in the VM (tests/vm/suites/rxe_wire.sh boots it with two e1000e NICs
# on the hub and a pcap on NIC 1): makes Linux soft-RoCE (rdma_rxe) put real
# RC SENDs on the wire so the host can parse them with ufab's RoCEv2 parser.
#
# rxe0 sits on eth0 (10.99.0.1). The peer 10.99.0.2 does not exist: a
# permanent neighbour entry points it at NIC 2's MAC (eth1, up, no address),
# so rxe never ARPs and its frames leave NIC 1, where the pcap sees them.
# For each run, ibv_rc_pingpong (the client) does its TCP exchange with
# tests/vm/fake_pingpong_server.py over loopback; the fake server names
# QPN/PSN/GID ::ffff:10.99.0.2, so the client's QP sends SENDs there and
# retransmits (about every 67 ms: timeout 14) until `timeout 8` stops it
# (nobody ACKs; rc_pingpong's retry_cnt 7 did not end it within 30 s).
#
# Prints one line per run for the host side:
#   RXE_RUN size=S rqpn=0xQ client_qpn=0xQ client_psn=0xP client_gid=HEX
# and once "RXE_TTL=N" (net.ipv4.ip_default_ttl: the TTL rxe sends, see
# pcap_roce_check.cc).
# Exit status: 0 when rxe came up and every run's exchange happened.
set -euo pipefail
here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
peer_mac=${UFAB_VM_NIC2_MAC:?run under run-vm with two NICs}
port=18515
gid_local=00000000000000000000ffff0a630001   # ::ffff:10.99.0.1
gid_peer=00000000000000000000ffff0a630002    # ::ffff:10.99.0.2

say() { printf 'rxe_capture_guest: %s\n' "$*" >&2; }
fail() { say "error: $*"; exit 1; }

# rxe computes its ICRC through the crypto API ("crc32"). In this guest the
# kernel does not load the algorithm on demand, and without it `rdma link
# add` fails with ENOENT ("rxe_newlink: failed to add eth0"): load it first.
timeout 60 modprobe crc32_generic || fail "modprobe crc32_generic failed"
timeout 60 modprobe rdma_rxe || fail "modprobe rdma_rxe failed"
ip addr add 10.99.0.1/24 dev eth0
ip link set eth0 up
ip link set eth1 up
timeout 20 rdma link add rxe0 type rxe netdev eth0 || fail "rdma link add rxe0 failed"
ip neigh replace 10.99.0.2 lladdr "$peer_mac" dev eth0 nud permanent

# The RoCE v2 GID entry for ::ffff:10.99.0.1 (rxe adds it once the address
# and the link are up; allow 10 s).
gids=/sys/class/infiniband/rxe0/ports/1/gids
types=/sys/class/infiniband/rxe0/ports/1/gid_attrs/types
want=${gid_local:0:4}
for ((k = 4; k < 32; k += 4)); do want+=":${gid_local:k:4}"; done
idx=
for _ in $(seq 1 100); do
  for f in "$gids"/*; do
    n=${f##*/}
    [[ $(cat "$f" 2>/dev/null) == "$want" ]] || continue
    [[ $(cat "$types/$n" 2>/dev/null) == "RoCE v2" ]] || continue
    idx=$n
    break
  done
  [[ -z $idx ]] || break
  sleep 0.1
done
[[ -n $idx ]] || { ls -l "$gids" >&2 || true; fail "no RoCE v2 GID $want on rxe0 within 10 s"; }
say "rxe0 up on eth0, RoCE v2 GID index $idx ($want), peer 10.99.0.2 -> $peer_mac"
printf 'RXE_TTL=%s\n' "$(cat /proc/sys/net/ipv4/ip_default_ttl)"
say "active MTU: $(ibv_devinfo -d rxe0 2>/dev/null | sed -n 's/^[[:space:]]*active_mtu:[[:space:]]*//p' | head -n1)"

# run SIZE RQPN_HEX RPSN_HEX
run() {
  local size=$1 rqpn=$2 rpsn=$3 log client_rc=0 srv_rc=0 line
  log=$(mktemp)
  timeout 40 /usr/bin/python3 "$here/fake_pingpong_server.py" "$port" "$rqpn" "$rpsn" "$gid_peer" 5 >"$log" &
  local spid=$!
  # Wait (bounded) for the server to listen.
  for _ in $(seq 1 100); do
    ss -ltn 2>/dev/null | grep -q ":$port " && break
    sleep 0.1
  done
  timeout 8 ibv_rc_pingpong -d rxe0 -g "$idx" -n 3 -s "$size" -p "$port" 127.0.0.1 >&2 || client_rc=$?
  say "ibv_rc_pingpong -s $size exited with $client_rc (non-zero is expected: nobody answers)"
  wait "$spid" || srv_rc=$?
  line=$(grep '^client ' "$log" | head -n1 || true)
  rm -f "$log"
  ((srv_rc == 0)) || fail "fake server for size $size exited with $srv_rc"
  [[ $line =~ ^client\ lid=([0-9a-f]{4})\ qpn=([0-9a-f]{6})\ psn=([0-9a-f]{6})\ gid=([0-9a-f]{32})$ ]] ||
    fail "no client message from the fake server (got '$line')"
  printf 'RXE_RUN size=%s rqpn=0x%s client_qpn=0x%s client_psn=0x%s client_gid=%s\n' \
    "$size" "$rqpn" "${BASH_REMATCH[2]}" "${BASH_REMATCH[3]}" "${BASH_REMATCH[4]}"
}

run 64 000123 000456
run 4096 000124 000789
# Let the last retransmissions reach the pcap.
sleep 1
