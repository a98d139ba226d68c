#!/usr/bin/env bash
# Runs `ufab cmatose` (ucmatose over ufab's connection manager) against
# itself over a software NIC link (swnic:cmPID:0 server at 10.0.0.1,
# swnic:cmPID:1 client at 10.0.0.2): several connections with messages both
# ways, --json, 5% loss on both ports, and the errors: a port nobody
# listens on (REJ 8) and a server that is gone (no ARP answer).
#
# `bazel test //tests/tools:cmatose_test`, or from the repository root
# after `bazel build //tools/ufab`:
#   tests/tools/cmatose_test.sh [PATH_TO_UFAB]
set -uo pipefail

name=cmatose_test
link=cm$$  # a swnic link no concurrent run uses
# shellcheck source=tests/tools/two_ports.sh
. "$(dirname "$0")/two_ports.sh"
two_ports_setup "${1:-}"

# Starts a server (arguments after `cmatose DEVICE --ip`) and waits for its
# "listening" line.
start_server() {
  rm -f "$dir/server.out" "$dir/server.err"
  timeout 60 "$bin" cmatose "swnic:$link:0" --ip 10.0.0.1 --param stale=reset "$@" >"$dir/server.out" 2>"$dir/server.err" &
  server_pid=$!
  for _ in $(seq 200); do
    grep -q "listening on" "$dir/server.err" && return 0
    kill -0 "$server_pid" 2>/dev/null || return 1
    sleep 0.05
  done
  return 1
}
wait_server() {
  wait "$server_pid"
  server_rc=$?
  server_pid=
}
client() { timeout 60 "$bin" cmatose "swnic:$link:1" --ip 10.0.0.2 -s 10.0.0.1 "$@"; }

# 1. Three connections, 20 messages of 1000 bytes each way.
if start_server -c 3 -C 20 -S 1000; then
  client -c 3 -C 20 -S 1000 >"$dir/client.out" 2>"$dir/client.err"
  rc=$?
  wait_server
  if [ "$rc" -eq 0 ] && [ "$server_rc" -eq 0 ] &&
    grep -q "3 connection(s), 20 messages of 1000 bytes each way; 60 received messages carried ufab's pattern" "$dir/client.out" &&
    grep -q "60 received messages carried" "$dir/server.out" &&
    grep -q "^cmatose: disconnecting" "$dir/server.out" && grep -q "^cmatose: disconnected" "$dir/client.out"; then
    pass "3 connections, 20 messages each way, every message checked on both sides"
  else
    fail "3 connections (client $rc, server $server_rc)"; show client.out client.err server.out server.err
  fi
else
  fail "the server did not start listening"; show server.out server.err
fi

# 2. --json on the client.
if start_server -C 5 -S 64; then
  client -C 5 -S 64 --json >"$dir/client.out" 2>"$dir/client.err"
  rc=$?
  wait_server
  if [ "$rc" -eq 0 ] && grep -q '"ok":true' "$dir/client.out" && grep -q '"role":"client"' "$dir/client.out" &&
    grep -q '"messages_checked":5' "$dir/client.out" && ! grep -q '^cmatose:' "$dir/client.out"; then
    pass "--json: one object, the counts"
  else
    fail "--json (client $rc)"; show client.out client.err
  fi
else
  fail "the server did not start listening (json)"; show server.err
fi

# 3. 5% loss on both ports: the CM retransmits, the transport too.
if start_server -c 2 -C 50 -S 2000 --param loss=0.05 --param seed=5; then
  client -c 2 -C 50 -S 2000 --param loss=0.05 --param seed=6 >"$dir/client.out" 2>"$dir/client.err"
  rc=$?
  wait_server
  if [ "$rc" -eq 0 ] && [ "$server_rc" -eq 0 ] && grep -q "100 received messages carried" "$dir/client.out"; then
    pass "5% loss: 2 connections, 50 messages each way"
  else
    fail "5% loss (client $rc, server $server_rc)"; show client.out client.err server.out server.err
  fi
else
  fail "the server did not start listening (loss)"; show server.err
fi

# 4. A port nobody listens on: REJ 8 from the peer's CM, exit 1.
if start_server -p 7000; then
  client -p 7001 >"$dir/client.out" 2>"$dir/client.err"
  rc=$?
  if [ "$rc" -eq 1 ] && grep -q "rejected the connection: reason 8 (invalid service id)" "$dir/client.err"; then
    pass "a port nobody listens on: rejected, reason 8"
  else
    fail "no listener (rc $rc)"; show client.out client.err
  fi
  client -p 7000 -C 1 >/dev/null 2>&1  # lets the server finish
  wait_server
else
  fail "the server did not start listening (port 7000)"; show server.err
fi

# 5. Nobody at all: no ARP answer, exit 1 with the reason.
client -C 1 >"$dir/client.out" 2>"$dir/client.err"
rc=$?
if [ "$rc" -eq 1 ] && grep -q "10.0.0.1:7471 is unreachable: no ARP answer" "$dir/client.err"; then
  pass "a server that is not there: unreachable (no ARP answer)"
else
  fail "no server (rc $rc)"; show client.out client.err
fi

finish
