#!/usr/bin/env bash
# libfabric's own tools over the ufab provider (libufab-fi.so): fi_info
# lists the configured devices with the declared attributes, and
# fi_pingpong (server and client, two processes) passes with its data
# checks (-c) for FI_EP_MSG (RC + connection manager), FI_EP_DGRAM (UD) and
# FI_EP_RDM through ofi_rxm layered on ufab (msg and tagged), over a
# software NIC link: swnic:LINK:0 at 10.0.0.1 (server), swnic:LINK:1 at
# 10.0.0.2 (client); then msg, dgram and rdm (through ofi_rxm, and
# through ofi_rxd over dgram) over the shared-memory device shm:LINK. fi_pingpong's own control connection goes over
# 127.0.0.1; the fabric addresses travel on it.
#
# `bazel test //tests/fabric:fi_pingpong_test`, or from the repository root
# after `bazel build //fabric:libufab-fi.so`:
#   tests/fabric/fi_pingpong_test.sh [PATH_TO_libufab-fi.so]
set -uo pipefail

name=fi_pingpong_test
link=fi$$
so=${1:-}
if [ -z "$so" ]; then
  for c in fabric/libufab-fi.so bazel-bin/fabric/libufab-fi.so; do [ -f "$c" ] && { so=$c; break; }; done
fi
if [ "$so" = none ]; then
  echo "$name: SKIP: libufab-fi.so is not built here: no libfabric headers (apt-get install libfabric-dev; scripts/setup.sh does)"
  exit 0
fi
if ! command -v fi_pingpong >/dev/null || ! command -v fi_info >/dev/null; then
  echo "$name: SKIP: fi_info/fi_pingpong not installed (apt-get install libfabric-bin; scripts/setup.sh does)"
  exit 0
fi
if [ ! -f "$so" ]; then
  echo "$name: no libufab-fi.so (bazel build //fabric:libufab-fi.so; it needs libfabric-dev)"
  exit 1
fi
dir=$(mktemp -d "${TEST_TMPDIR:-/tmp}/$name.XXXXXX")
mkdir -p "$dir/prov"
cp "$so" "$dir/prov/libufab-fi.so"
export FI_PROVIDER_PATH=$dir/prov
server_pid=
passed=0 failed=0
cleanup() {
  if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null; wait "$server_pid" 2>/dev/null; fi
  rm -rf "$dir"
  rm -f "/dev/shm/ufab-swnic-$link"
}
trap cleanup EXIT
pass() { passed=$((passed + 1)); echo "PASS $*"; }
fail() { failed=$((failed + 1)); echo "FAIL $*"; }
show() { for f in "$@"; do echo "--- $f"; tail -n 20 "$dir/$f" 2>/dev/null | cut -c1-160 | sed 's/^/  | /'; done; }

# 1. fi_info lists the device: MSG and DGRAM, with the attributes we declare.
out=$(FI_UFAB_DEVICES="swnic:$link:0@10.0.0.1" timeout 30 fi_info -p ufab -v 2>&1)
echo "$out" >"$dir/fi_info.out"
check() { # what, pattern
  if grep -q -- "$2" "$dir/fi_info.out"; then pass "fi_info: $1"; else fail "fi_info: $1 (no '$2')"; show fi_info.out; fi
}
check "MSG endpoint" "type: *FI_EP_MSG"
check "DGRAM endpoint" "type: *FI_EP_DGRAM"
check "domain is the device" "name: swnic:$link:0"
check "mr_mode" "mr_mode: \[ FI_MR_LOCAL, FI_MR_VIRT_ADDR, FI_MR_ALLOCATED, FI_MR_PROV_KEY \]"
check "AF_INET address" "fi_sockaddr_in://10.0.0.1:0"
check "UD address" "fi_ufab_ud://10.0.0.1:0"
check "RMA caps" "FI_RMA"
check "remote CQ data" "cq_data_size: 4"
check "rxm layers over it" "ufab;ofi_rxm"
out=$(FI_UFAB_DEVICES="" timeout 30 fi_info -p ufab 2>&1)
if grep -q "FI_ENODATA\|No data available\|fi_getinfo: -61" <<<"$out"; then pass "fi_info: no devices configured, none listed"; else fail "fi_info without FI_UFAB_DEVICES: $out"; fi
out=$(FI_UFAB_DEVICES="swnic:$link:0@not-an-ip" timeout 30 fi_info -p ufab 2>&1)
if grep -q "not an IPv4 address" <<<"$out"; then pass "fi_info: a bad address is named"; else fail "fi_info with a bad address: $out"; fi
out=$(FI_UFAB_STATS=1 FI_UFAB_DEVICES="swnic:$link:0@10.0.0.1" timeout 30 fi_info -p ufab 2>&1 >/dev/null)
if grep -q "^libufab-fi: stats swnic:$link:0: tx_frames [0-9]* rx_frames [0-9]* rx_roce [0-9]* .*retransmits [0-9]*$" <<<"$out"; then
  pass "FI_UFAB_STATS=1: the device's counters at exit"
else
  fail "FI_UFAB_STATS=1 printed no counters line: $out"
fi
rm -f "/dev/shm/ufab-swnic-$link"

# 2. fi_pingpong, server and client.
pingpong() { # label, provider, fi_pingpong options...
  local label=$1 prov=$2; shift 2
  rm -f "$dir/server.out" "$dir/client.out"
  # fi_pingpong's control connection: a port of this run's (not 47592, so
  # runs side by side do not meet), and the client starts once it listens.
  local port=$((20000 + RANDOM % 30000))
  FI_PROVIDER=$prov FI_UFAB_DEVICES=${server_dev:-swnic:$link:0@10.0.0.1} timeout 120 fi_pingpong -B "$port" "$@" >"$dir/server.out" 2>&1 &
  server_pid=$!
  for _ in $(seq 100); do
    ss -ltn 2>/dev/null | grep -q ":$port " && break
    kill -0 "$server_pid" 2>/dev/null || break
    sleep 0.05
  done
  FI_PROVIDER=$prov FI_UFAB_DEVICES=${client_dev:-swnic:$link:1@10.0.0.2} timeout 120 fi_pingpong -P "$port" "$@" 127.0.0.1 >"$dir/client.out" 2>&1
  local crc=$?
  wait "$server_pid"
  local src=$?
  server_pid=
  rm -f "/dev/shm/ufab-swnic-$link"
  # Every size line of both sides must show all messages acknowledged.
  local lines
  lines=$(grep -c '^[0-9]' "$dir/client.out")
  if [ "$crc" -eq 0 ] && [ "$src" -eq 0 ] && [ "$lines" -gt 0 ] && ! grep -q "error\|fail" "$dir/client.out" "$dir/server.out"; then
    pass "fi_pingpong $label ($lines sizes, data checked)"
  else
    fail "fi_pingpong $label: client rc $crc, server rc $src"
    show server.out client.out
  fi
}
pingpong "-e msg" ufab -p ufab -e msg -c -I 50
pingpong "-e msg -S 1048576" ufab -p ufab -e msg -c -I 10 -S 1048576
pingpong "-e dgram" ufab -p ufab -e dgram -c -I 50
pingpong "-e rdm (ufab;ofi_rxm)" "ufab;ofi_rxm" -e rdm -c -I 50
pingpong "-e rdm -m tagged (ufab;ofi_rxm)" "ufab;ofi_rxm" -e rdm -m tagged -c -I 50

# 3. The shared-memory device: both processes open shm:DOMAIN (its own
# connection exchange for MSG; UD queue pairs for DGRAM).
server_dev="shm:$link" client_dev="shm:$link"
pingpong "-e msg over shm" ufab -p ufab -e msg -c -I 50
pingpong "-e dgram over shm" ufab -p ufab -e dgram -c -I 50
# libfabric's own reliability layer over our datagrams (RDM over DGRAM).
pingpong "-e rdm over shm (ufab;ofi_rxd)" "ufab;ofi_rxd" -e rdm -c -I 50
pingpong "-e rdm over shm (ufab;ofi_rxm)" "ufab;ofi_rxm" -e rdm -m tagged -c -I 50
unset server_dev client_dev

echo "$name: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
