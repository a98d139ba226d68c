#!/usr/bin/env bash
# Runs examples/rdma_example as server and client over a software NIC link
# (swnic:exPID:0 and :1, addresses 10.0.0.1 and 10.0.0.2) and over the
# shared-memory provider (shm:exPID), TCP exchange on 127.0.0.1 on a port the
# server picks, and checks that both end with "rdma_example: all N steps
# OK"; also --help and a usage error.
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

# One pair: the server first (it prints its port once it listens), then the
# client; both must end with their "all N steps OK" line.
run_pair() {  # tag, server device args..., --, client device args...
  local tag=$1
  shift
  local server_args=() client_args=()
  while [ "$1" != "--" ]; do server_args+=("$1"); shift; done
  shift
  client_args=("$@")
  timeout 30 "$bin" "${server_args[@]}" --listen 0 --timeout 20 >"$dir/server-$tag" 2>&1 &
  server_pid=$!
  local port=
  for _ in $(seq 200); do
    port=$(sed -n 's/.*listening on TCP port \([0-9][0-9]*\).*/\1/p' "$dir/server-$tag")
    if [ -n "$port" ] || ! kill -0 "$server_pid" 2>/dev/null; then break; fi
    sleep 0.05
  done
  if [ -z "$port" ]; then
    fail "$tag: the server did not start listening"
  else
    timeout 30 "$bin" "${client_args[@]}" --connect "127.0.0.1:$port" --timeout 20 >"$dir/client-$tag" 2>&1
    local client_rc=$?
    [ "$client_rc" -eq 0 ] || fail "$tag: the client exited with status $client_rc"
  fi
  wait "$server_pid"
  local server_rc=$?
  server_pid=
  [ "$server_rc" -eq 0 ] || fail "$tag: the server exited with status $server_rc"
  for side in server client; do
    echo "--- $tag $side"
    cat "$dir/$side-$tag" 2>/dev/null
  done
  [ "$(tail -n1 "$dir/server-$tag")" = "rdma_example: all 5 steps OK" ] ||
    fail "$tag: the server's last line is not 'all 5 steps OK'"
  [ -f "$dir/client-$tag" ] && [ "$(tail -n1 "$dir/client-$tag")" = "rdma_example: all 7 steps OK" ] ||
    fail "$tag: the client's last line is not 'all 7 steps OK'"
}

# Soft-RoCE over a swnic link (stale=reset clears a segment a killed run
# may have left), then the shared-memory provider.
run_pair swnic --device "swnic:$link:0" --ip 10.0.0.1 --param stale=reset -- --device "swnic:$link:1" --ip 10.0.0.2
run_pair shm --device "shm:$link" -- --device "shm:$link"

if [ "$failures" -ne 0 ]; then
  echo "rdma_example_test: $failures failed"
  exit 1
fi
echo "rdma_example_test: passed"
