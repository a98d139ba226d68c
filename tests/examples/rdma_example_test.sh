#!/usr/bin/env bash
# Runs examples/rdma_example as server and client over a software NIC link
# (swnic:exPID:0 and :1, addresses 10.0.0.1 and 10.0.0.2, TCP exchange on
# 127.0.0.1 on a port the server picks) and checks that both end with
# "rdma_example: all N steps OK"; also --help and a usage error.
#
# `bazel test //tests/examples:rdma_example_test`, or from the repository
# root after `bazel build //examples:rdma_example`:
#   tests/examples/rdma_example_test.sh [PATH_TO_RDMA_EXAMPLE]
set -uo pipefail

bin=${1:-}
if [ -z "$bin" ]; then
  for candidate in examples/rdma_example bazel-bin/examples/rdma_example; do
    if [ -x "$candidate" ]; then bin=$candidate; break; fi
  done
fi
if [ ! -x "$bin" ]; then
  echo "rdma_example_test: no rdma_example binary (bazel build //examples:rdma_example)"
  exit 1
fi

dir=$(mktemp -d "${TEST_TMPDIR:-/tmp}/rdma_example.XXXXXX")
link=ex$$  # a swnic link no concurrent run uses
server_pid=
cleanup() {
  if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null; wait "$server_pid" 2>/dev/null; fi
  rm -rf "$dir"
  rm -f "/dev/shm/ufab-swnic-$link"  # left behind only if a process was killed
}
trap cleanup EXIT

failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# --help: usage on stdout, status 0; a usage error: status 2.
"$bin" --help >"$dir/help" 2>&1 || fail "--help exited with $?"
grep -q -- '--connect HOST:PORT' "$dir/help" || fail "--help does not show the usage"
"$bin" --device swnic:$link:0 --ip 10.0.0.1 >"$dir/usage" 2>&1
rc=$?
[ "$rc" -eq 2 ] || fail "no --listen/--connect: status $rc, expected 2"
grep -q 'exactly one of --listen' "$dir/usage" || fail "no --listen/--connect: unexpected message: $(cat "$dir/usage")"

# The server first (stale=reset clears a segment a killed run may have
# left); it prints its port once it listens.
timeout 30 "$bin" --device "swnic:$link:0" --ip 10.0.0.1 --listen 0 --param stale=reset --timeout 20 \
  >"$dir/server" 2>&1 &
server_pid=$!
port=
for _ in $(seq 200); do
  port=$(sed -n 's/.*listening on TCP port \([0-9][0-9]*\).*/\1/p' "$dir/server")
  if [ -n "$port" ] || ! kill -0 "$server_pid" 2>/dev/null; then break; fi
  sleep 0.05
done
if [ -z "$port" ]; then
  fail "the server did not start listening"
else
  timeout 30 "$bin" --device "swnic:$link:1" --ip 10.0.0.2 --connect "127.0.0.1:$port" --timeout 20 \
    >"$dir/client" 2>&1
  client_rc=$?
  [ "$client_rc" -eq 0 ] || fail "the client exited with status $client_rc"
fi
wait "$server_pid"
server_rc=$?
server_pid=
[ "$server_rc" -eq 0 ] || fail "the server exited with status $server_rc"

for side in server client; do
  echo "--- $side"
  cat "$dir/$side" 2>/dev/null
done
[ "$(tail -n1 "$dir/server")" = "rdma_example: all 5 steps OK" ] || fail "the server's last line is not 'all 5 steps OK'"
[ -f "$dir/client" ] && [ "$(tail -n1 "$dir/client")" = "rdma_example: all 7 steps OK" ] ||
  fail "the client's last line is not 'all 7 steps OK'"

if [ "$failures" -ne 0 ]; then
  echo "rdma_example_test: $failures failed"
  exit 1
fi
echo "rdma_example_test: passed"
