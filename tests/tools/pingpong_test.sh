#!/usr/bin/env bash
# Runs `ufab pingpong` against itself over a software NIC link (swnic:ppPID:0
# server at 10.0.0.1, swnic:ppPID:1 client at 10.0.0.2, the TCP exchange on
# 127.0.0.1 on a port the server picks with -p 0): ibv_rc_pingpong's default
# run, single- and multi-packet sizes with a small receive depth, loss, and
# --json; then the errors: usage, no server, a server that sees no client,
# and (with python3) a peer whose message is malformed or carries no GID.
#
# `bazel test //tests/tools:pingpong_test`, or from the repository root
# after `bazel build //tools/ufab`:
#   tests/tools/pingpong_test.sh [PATH_TO_UFAB]
set -uo pipefail

bin=${1:-}
if [ -z "$bin" ]; then
  for candidate in tools/ufab/ufab bazel-bin/tools/ufab/ufab; do
    if [ -x "$candidate" ]; then bin=$candidate; break; fi
  done
fi
if [ ! -x "$bin" ]; then
  echo "pingpong_test: no ufab binary (bazel build //tools/ufab)"
  exit 1
fi

dir=$(mktemp -d "${TEST_TMPDIR:-/tmp}/pingpong_test.XXXXXX")
link=pp$$  # a swnic link no concurrent run uses
server_pid=
cleanup() {
  if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null; wait "$server_pid" 2>/dev/null; fi
  rm -rf "$dir"
  rm -f "/dev/shm/ufab-swnic-$link"  # left behind only if a process was killed
}
trap cleanup EXIT

passed=0 failed=0
pass() { passed=$((passed + 1)); echo "PASS $*"; }
fail() { failed=$((failed + 1)); echo "FAIL $*"; }
show() { for f in "$@"; do echo "--- $f"; sed 's/^/  | /' "$dir/$f" 2>/dev/null; done; }

# Starts the server (arguments: the command line after the binary) in the
# background; sets server_pid and port from its "waiting for a client on TCP
# port N" line on stderr.
start_server() {
  # Gone before the server starts, so the port is never the last run's.
  rm -f "$dir/server.out" "$dir/server.err"
  timeout 60 "$bin" "$@" >"$dir/server.out" 2>"$dir/server.err" &
  server_pid=$!
  port=
  for _ in $(seq 200); do
    port=$(sed -n 's/.*waiting for a client on TCP port \([0-9][0-9]*\).*/\1/p' "$dir/server.err")
    if [ -n "$port" ] || ! kill -0 "$server_pid" 2>/dev/null; then break; fi
    sleep 0.05
  done
  [ -n "$port" ]
}
wait_server() {
  wait "$server_pid"
  server_rc=$?
  server_pid=
}

# run NAME BYTES ITERS "SERVER_OPTIONS" "CLIENT_OPTIONS": both sides must
# exit 0, print rc_pingpong's address lines (each side's remote QPN being
# the other's local one) and its two summary lines with BYTES and ITERS.
run() {
  local name=$1 bytes=$2 iters=$3 sopts=$4 copts=$5 client_rc
  # shellcheck disable=SC2086  # the option strings are meant to split
  if ! start_server pingpong "swnic:$link:0" --ip 10.0.0.1 --param stale=reset -p 0 $sopts; then
    fail "$name: the server did not start listening"; show server.out server.err; wait_server; return
  fi
  # shellcheck disable=SC2086
  timeout 60 "$bin" pingpong "swnic:$link:1" --ip 10.0.0.2 127.0.0.1 -p "$port" $copts \
    >"$dir/client.out" 2>"$dir/client.err"
  client_rc=$?
  wait_server
  if [ "$client_rc" -ne 0 ] || [ "$server_rc" -ne 0 ]; then
    fail "$name: client exited with $client_rc, server with $server_rc"
    show server.out server.err client.out client.err
    return
  fi
  echo "--- $name: client said"; sed 's/^/  | /' "$dir/client.out"
  local side ok=1 s_local c_remote
  for side in server client; do
    grep -Eq '^  local address:  LID 0x0000, QPN 0x[0-9a-f]{6}, PSN 0x[0-9a-f]{6}, GID ::ffff:10\.0\.0\.[12]$' \
      "$dir/$side.out" || ok=0
    grep -Eq '^  remote address: LID 0x0000, QPN 0x[0-9a-f]{6}, PSN 0x[0-9a-f]{6}, GID ::ffff:10\.0\.0\.[12]$' \
      "$dir/$side.out" || ok=0
  done
  s_local=$(sed -n 's/^  local address:  LID 0x0000, QPN \(0x[0-9a-f]*\),.*/\1/p' "$dir/server.out")
  c_remote=$(sed -n 's/^  remote address: LID 0x0000, QPN \(0x[0-9a-f]*\),.*/\1/p' "$dir/client.out")
  [ -n "$s_local" ] && [ "$s_local" = "$c_remote" ] || ok=0
  if [ "$ok" -eq 1 ]; then pass "$name: address lines"; else fail "$name: address lines"; show server.out client.out; fi
  if grep -Eq "^$bytes bytes in [0-9]+\.[0-9]{2} seconds = [0-9]+\.[0-9]{2} Mbit/sec$" "$dir/client.out" &&
    grep -Eq "^$iters iters in [0-9]+\.[0-9]{2} seconds = [0-9]+\.[0-9]{2} usec/iter$" "$dir/client.out" &&
    grep -Eq "^$bytes bytes in " "$dir/server.out" && grep -Eq "^$iters iters in " "$dir/server.out"; then
    pass "$name: both print '$bytes bytes in' and '$iters iters in'"
  else
    fail "$name: summary lines"; show server.out client.out
  fi
}

# ibv_rc_pingpong's defaults: 4096 bytes, 1000 iterations, 500 receives.
run "defaults" 8192000 1000 "" ""
# One byte; 64 KiB = 64 packets at MTU 1024, with only 3 receives posted at
# a time so they are topped up every round trip.
run "size 1" 400 200 "-s 1 -n 200" "-s1 -n200"
run "size 65536, rx depth 3" 13107200 100 "--size 65536 -n 100 -r 3" "-s 65536 --iters=100 --rx-depth 3"
# MTU 256 (16 packets per 4 KiB message) and 2% loss on the server's TX:
# its SENDs and its ACKs of the client's, so sequence NAKs, timeouts and
# retransmissions happen both ways. Not on the client's TX: the client's
# ACK of the last message is the one packet no one sends again (the
# client is gone), as with ibv_rc_pingpong itself.
run "mtu 256, loss 2%" 1638400 200 "-m 256 -n 200 --param loss=0.02 --param seed=1" "-m 256 -n 200"

# --json: one object on stdout per side, the address lines on stderr.
if start_server --json pingpong "swnic:$link:0" --ip 10.0.0.1 --param stale=reset -p 0 -n 10; then
  timeout 60 "$bin" --json pingpong "swnic:$link:1" --ip 10.0.0.2 127.0.0.1 -p "$port" -n 10 \
    >"$dir/client.out" 2>"$dir/client.err"
  client_rc=$?
  wait_server
  if [ "$client_rc" -eq 0 ] && [ "$server_rc" -eq 0 ] && [ "$(wc -l <"$dir/client.out")" -eq 1 ] &&
    grep -q '^{"ok":true,"command":"pingpong","role":"client",.*"bytes":81920,' "$dir/client.out" &&
    grep -q '"role":"server",.*"iters":10,' "$dir/server.out" &&
    grep -q '^  remote address: ' "$dir/client.err"; then
    pass "--json"
  else
    fail "--json (client $client_rc, server $server_rc)"; show server.out client.out client.err
  fi
else
  fail "--json: the server did not start"; show server.err; wait_server
fi

# expect NAME STATUS PATTERN COMMAND...: COMMAND exits with STATUS and its
# stderr matches PATTERN (grep -E).
expect() {
  local name=$1 want=$2 pattern=$3 rc
  shift 3
  timeout 60 "$@" >"$dir/out" 2>"$dir/err"
  rc=$?
  if [ "$rc" -eq "$want" ] && grep -Eq -- "$pattern" "$dir/err"; then
    pass "$name"
  else
    fail "$name: status $rc (want $want)"; show out err
  fi
}
expect "no --ip is a usage error" 2 'ufab pingpong: --ip A\.B\.C\.D is required' "$bin" pingpong "swnic:$link:0"
expect "bad --ip is a usage error" 2 '--ip 10\.0\.0\.300: expected an IPv4 address' \
  "$bin" pingpong "swnic:$link:0" --ip 10.0.0.300
expect "bad -m is a usage error" 2 '--mtu 1000: expected 256' "$bin" pingpong "swnic:$link:0" --ip 10.0.0.1 -m 1000
expect "-s 0 is a usage error" 2 '--size 0: expected a number from 1' "$bin" pingpong "swnic:$link:0" --ip 10.0.0.1 -s 0
expect "-n on another command is a usage error" 2 'applies only to `ufab perf` and `ufab pingpong`' "$bin" list -n 3
expect "three arguments are a usage error" 2 'wrong number of arguments' \
  "$bin" pingpong "swnic:$link:0" --ip 10.0.0.1 a b
# A free port: the server's, once it is gone.
expect "client with no server" 1 'connection refused for 1000 ms' \
  "$bin" pingpong "swnic:$link:1" --ip 10.0.0.2 --param stale=reset 127.0.0.1 -p "$port" --timeout 1
expect "server with no client" 1 'waiting for the client on TCP port [0-9]+: .*' \
  "$bin" pingpong "swnic:$link:0" --ip 10.0.0.1 --param stale=reset -p 0 --timeout 1

# A peer that is not a pingpong: a server answering one message (written in
# python3, skipped without it).
fake_server() { # MESSAGE_PYTHON_LITERAL: serves one client, then exits; prints its port first
  rm -f "$dir/fake.port"  # never read the previous fake server's port
  python3 -c '
import socket, sys
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(1)
print(s.getsockname()[1], flush=True)
s.settimeout(30)
c, _ = s.accept(); c.settimeout(30)
got = b""
while len(got) < 52:
    d = c.recv(52 - len(got))
    if not d: break
    got += d
msg = eval(sys.argv[1])
c.sendall(msg)
if len(msg) < 52:
    c.close()
    sys.exit(0)
try:
    c.recv(16)
except Exception:
    pass
' "$1" >"$dir/fake.port" 2>"$dir/fake.err" &
  fake_pid=$!
  fake_port=
  for _ in $(seq 100); do
    fake_port=$(head -n1 "$dir/fake.port" 2>/dev/null)
    [ -n "$fake_port" ] && break
    sleep 0.05
  done
}
if command -v python3 >/dev/null; then
  fake_server 'b"0000:000123:000456:" + b"0" * 32 + b"\0"'
  expect "peer without a GID (ibv_rc_pingpong without -g)" 1 'sent GID :: \(ibv_rc_pingpong without -g\).*-g <index' \
    "$bin" pingpong "swnic:$link:1" --ip 10.0.0.2 --param stale=reset 127.0.0.1 -p "$fake_port" --timeout 5
  wait "$fake_pid"
  fake_server 'b"0000:000123:000456:" + b"fe800000000000000000000000000001" + b"\0"'
  expect "peer with an IPv6 GID" 1 'GID fe80::1 is not an IPv4-mapped address' \
    "$bin" pingpong "swnic:$link:1" --ip 10.0.0.2 --param stale=reset 127.0.0.1 -p "$fake_port" --timeout 5
  wait "$fake_pid"
  fake_server 'b"hello, this is not what rc_pingpong sends at all!!\n\0"'
  expect "malformed peer message" 1 "the server's address: rc_pingpong message: " \
    "$bin" pingpong "swnic:$link:1" --ip 10.0.0.2 --param stale=reset 127.0.0.1 -p "$fake_port" --timeout 5
  wait "$fake_pid"
  fake_server 'b"0000:00"'
  expect "peer closing part way" 1 "reading the server's address: .*closed the connection after 7 of 52 bytes" \
    "$bin" pingpong "swnic:$link:1" --ip 10.0.0.2 --param stale=reset 127.0.0.1 -p "$fake_port" --timeout 5
  wait "$fake_pid"
else
  echo "SKIP fake-peer cases: no python3"
fi

echo "pingpong_test: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
