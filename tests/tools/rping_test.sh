#!/usr/bin/env bash
# Runs `ufab rping` (rdma-core's rping over ufab's connection manager)
# against itself over a software NIC link (swnic:rpPID:0 server at
# 10.0.0.1, swnic:rpPID:1 client at 10.0.0.2): -C 20 -V at -S 64 and
# -S 65535 (rping's largest), every -v line checked against rping's text on
# both sides, --json, 2% loss on both ports, and the errors: a port nobody
# listens on (rejected), nobody at all (unreachable), different -S on the
# two sides, and rping's option limits (exit 2).
#
# `bazel test //tests/tools:rping_test`, or from the repository root after
# `bazel build //tools/ufab`:
#   tests/tools/rping_test.sh [PATH_TO_UFAB]
set -uo pipefail

bin=${1:-}
if [ -z "$bin" ]; then
  for candidate in tools/ufab/ufab bazel-bin/tools/ufab/ufab; do
    if [ -x "$candidate" ]; then bin=$candidate; break; fi
  done
fi
if [ ! -x "$bin" ]; then
  echo "rping_test: no ufab binary (bazel build //tools/ufab)"
  exit 1
fi

dir=$(mktemp -d "${TEST_TMPDIR:-/tmp}/rping_test.XXXXXX")
link=rp$$
server_pid=
cleanup() {
  if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null; wait "$server_pid" 2>/dev/null; fi
  rm -rf "$dir"
  rm -f "/dev/shm/ufab-swnic-$link"
}
trap cleanup EXIT

passed=0 failed=0
pass() { passed=$((passed + 1)); echo "PASS $*"; }
fail() { failed=$((failed + 1)); echo "FAIL $*"; }
# Long -v lines are cut for the log.
show() { for f in "$@"; do echo "--- $f"; head -n 30 "$dir/$f" 2>/dev/null | cut -c1-160 | sed 's/^/  | /'; done; }

# expected PREFIX COUNT SIZE: the lines rping -v prints for COUNT pings of
# SIZE bytes: PREFIX, "rdma-ping-N: ", then letters from 'A' + N mod 58
# ('A'..'z', wrapping), SIZE - 1 characters after PREFIX (the buffer's last
# byte is its NUL).
expected() {
  awk -v pfx="$1" -v count="$2" -v size="$3" 'BEGIN {
    for (n = 0; n < count; n++) {
      line = sprintf("rdma-ping-%d: ", n)
      c = 65 + n % 58
      while (length(line) < size - 1) {
        line = line sprintf("%c", c)
        c = (c == 122) ? 65 : c + 1
      }
      print pfx line
    }
  }'
}
# lines_match FILE PREFIX COUNT SIZE: FILE's PREFIX lines are exactly rping's.
lines_match() {
  grep -a "^$2" "$1" >"$dir/got" 2>/dev/null
  expected "$2" "$3" "$4" >"$dir/want"
  cmp -s "$dir/got" "$dir/want"
}

# Starts a server (arguments after `rping DEVICE --ip 10.0.0.1 -s`) and
# waits for its "listening" line.
start_server() {
  rm -f "$dir/server.out" "$dir/server.err"
  timeout 120 "$bin" rping "swnic:$link:0" --ip 10.0.0.1 --param stale=reset -s "$@" \
    >"$dir/server.out" 2>"$dir/server.err" &
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
client() { timeout 120 "$bin" rping "swnic:$link:1" --ip 10.0.0.2 -c -a 10.0.0.1 "$@"; }

# 1-2. -C 20 -V -v at both sizes; both sides' -v lines are rping's.
for size in 64 65535; do
  if start_server -S "$size" -v -V -C 20; then
    client -S "$size" -C 20 -v -V >"$dir/client.out" 2>"$dir/client.err"
    rc=$?
    wait_server
    if [ "$rc" -eq 0 ] && [ "$server_rc" -eq 0 ] &&
      lines_match "$dir/client.out" "ping data: " 20 "$size" &&
      lines_match "$dir/server.out" "server ping data: " 20 "$size" &&
      grep -q "^rping: 20 ping(s) of $size bytes with 10.0.0.1:7174 in .* s, validated$" "$dir/client.out" &&
      grep -q "disconnected after 20 ping(s)" "$dir/server.err" &&
      grep -q "^rping: 20 ping(s) of $size bytes with 10.0.0.2:[0-9]* in .* s, validated$" "$dir/server.out"; then
      pass "-S $size -C 20 -V: both sides validated, every -v line is rping's, the server ends at the disconnect"
    else
      fail "-S $size -C 20 (client $rc, server $server_rc)"; show client.out client.err server.out server.err
    fi
  else
    fail "the server did not start listening (-S $size)"; show server.out server.err
  fi
done

# 3. --json on both sides: one object each, nothing else on stdout.
if start_server -V --json; then
  client -C 5 -V --json >"$dir/client.out" 2>"$dir/client.err"
  rc=$?
  wait_server
  if [ "$rc" -eq 0 ] && [ "$server_rc" -eq 0 ] && [ "$(wc -l <"$dir/client.out")" -eq 1 ] &&
    grep -q '^{"ok":true,"command":"rping","role":"client","peer":"10.0.0.1:7174","port":7174,"count":5,"size":64,"validated":true,"elapsed":[0-9.e-]*}$' "$dir/client.out" &&
    grep -q '"role":"server".*"count":5,"size":64,"validated":true' "$dir/server.out"; then
    pass "--json: one object a side (role, peer, count, size, validated, elapsed)"
  else
    fail "--json (client $rc, server $server_rc)"; show client.out client.err server.out server.err
  fi
else
  fail "the server did not start listening (json)"; show server.out server.err
fi

# 4. 2% loss on both ports: CM messages and RC packets are sent again.
if start_server -S 4096 -V --param loss=0.02 --param seed=11; then
  client -S 4096 -C 50 -V --param loss=0.02 --param seed=12 >"$dir/client.out" 2>"$dir/client.err"
  rc=$?
  wait_server
  if [ "$rc" -eq 0 ] && [ "$server_rc" -eq 0 ] &&
    grep -q "^rping: 50 ping(s) of 4096 bytes with 10.0.0.1:7174 in .*, validated$" "$dir/client.out" &&
    grep -q "disconnected after 50 ping(s)" "$dir/server.err"; then
    pass "2% loss both ways: -S 4096 -C 50 validated"
  else
    fail "2% loss (client $rc, server $server_rc)"; show client.out client.err server.out server.err
  fi
else
  fail "the server did not start listening (loss)"; show server.out server.err
fi

# 5. A port nobody listens on: the server's CM rejects (invalid service
# id); the same server then serves the right port.
if start_server -p 7000 -C 1; then
  client -p 7001 -C 1 >"$dir/client.out" 2>"$dir/client.err"
  rc=$?
  if [ "$rc" -eq 1 ] &&
    grep -q "^ufab rping: 10.0.0.1:7001 rejected the connection: reason 8 (invalid service id): nothing listens on port 7001 there$" "$dir/client.err"; then
    pass "a port nobody listens on: rejected, reason 8, exit 1"
  else
    fail "no listener (rc $rc)"; show client.out client.err
  fi
  client -p 7000 -C 1 -V >"$dir/client.out" 2>"$dir/client.err"
  rc=$?
  wait_server
  if [ "$rc" -eq 0 ] && [ "$server_rc" -eq 0 ]; then
    pass "after that REJ the same server serves port 7000"
  else
    fail "the server after the REJ (client $rc, server $server_rc)"; show client.out client.err server.out server.err
  fi
else
  fail "the server did not start listening (port 7000)"; show server.out server.err
fi

# 6. Nobody at all: no ARP answer, exit 1 with the reason.
client -C 1 >"$dir/client.out" 2>"$dir/client.err"
rc=$?
if [ "$rc" -eq 1 ] && grep -q "10.0.0.1:7174 is unreachable: no ARP answer" "$dir/client.err"; then
  pass "a server that is not there: unreachable (no ARP answer), exit 1"
else
  fail "no server (rc $rc)"; show client.out client.err
fi

# 7. -S larger on the client than on the server: the server refuses to
# READ past its buffer and says why; the client learns of the disconnect.
if start_server -S 64; then
  client -S 128 -C 1 >"$dir/client.out" 2>"$dir/client.err"
  rc=$?
  wait_server
  if [ "$rc" -eq 1 ] && [ "$server_rc" -eq 1 ] &&
    grep -q "the client advertised a 128-byte buffer; this server's -S is 64 (give both sides the same -S)" "$dir/server.err" &&
    grep -q "10.0.0.1:7174 disconnected during ping 0" "$dir/client.err"; then
    pass "-S 128 against a -S 64 server: both fail, each says why"
  else
    fail "different -S (client $rc, server $server_rc)"; show client.out client.err server.out server.err
  fi
else
  fail "the server did not start listening (-S 64)"; show server.out server.err
fi

# 8. rping's limits and roles: usage errors, exit 2, nothing opened.
usage_case() { # WANT_TEXT ARGS...
  local want=$1
  shift
  timeout 20 "$bin" rping "swnic:$link:1" --ip 10.0.0.2 "$@" >"$dir/u.out" 2>"$dir/u.err"
  local r=$?
  if [ "$r" -eq 2 ] && grep -qF -- "$want" "$dir/u.err"; then
    pass "usage: rping $* -> exit 2, \"$want\""
  else
    fail "usage: rping $* (exit $r)"; show u.out u.err
  fi
}
usage_case "-S 65536: rping's sizes are 23 to 65535" -c -a 10.0.0.1 -S 65536
usage_case "-S 22: rping's sizes are 23 to 65535" -c -a 10.0.0.1 -S 22
usage_case "give one of -s (server) and -c (client)" -s -c
usage_case "give one of -s (server) and -c (client)" -a 10.0.0.1
usage_case "-c needs -a ADDR" -c
usage_case "-P (persistent server) is not supported" -s -P

echo "rping_test: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
