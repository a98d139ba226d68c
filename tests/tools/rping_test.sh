#!/usr/bin/env bash
# Runs `ufab rping` (rdma-core's rping over ufab's connection manager)
# against itself over a software NIC link (swnic:rpPID:0 server at
# 10.0.0.1, swnic:rpPID:1 client at 10.0.0.2): -C 20 -V at -S 64 and
# -S 65535 (rping's largest), every -v line checked against rping's text on
# both sides, --json, 2% loss on both ports, and the errors: a port nobody
# listens on (rejected), nobody at all (unreachable), different -S on the
# two sides, a server nobody connects to and a server killed mid-run (both
# bounded by --timeout), -C 0 ended by SIGINT, and rping's option limits
# (exit 2).
#
# `bazel test //tests/tools:rping_test`, or from the repository root after
# `bazel build //tools/ufab`:
#   tests/tools/rping_test.sh [PATH_TO_UFAB]
set -uo pipefail

name=rping_test
link=rp$$  # a swnic link no concurrent run uses
# shellcheck source=tests/tools/two_ports.sh
. "$(dirname "$0")/two_ports.sh"
two_ports_setup "${1:-}"

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
  { wait "$server_pid"; } 2>/dev/null  # no "Killed" job notice (case 8)
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

# 8. Bounded waits: a server nobody connects to gives up at --timeout; a
# client whose server dies (SIGKILL, so no DREQ) gives up at --timeout.
t0=$SECONDS
timeout 60 "$bin" rping "swnic:$link:0" --ip 10.0.0.1 --param stale=reset -s --timeout 1 \
  >"$dir/server.out" 2>"$dir/server.err"
rc=$?
if [ "$rc" -eq 1 ] && [ $((SECONDS - t0)) -le 10 ] &&
  grep -q "^ufab rping: no client connected to port 7174 within 1 s (--timeout)$" "$dir/server.err"; then
  pass "a server nobody connects to: exit 1 after --timeout 1"
else
  fail "server --timeout 1 (rc $rc after $((SECONDS - t0)) s)"; show server.out server.err
fi
if start_server; then
  client --timeout 2 >"$dir/client.out" 2>"$dir/client.err" &
  cpid=$!
  sleep 1
  # The ufab process under the server's `timeout`.
  kill -9 "$(pgrep -P "$server_pid")" 2>/dev/null
  wait "$cpid"
  rc=$?
  wait_server
  if [ "$rc" -eq 1 ] && grep -q "^ufab rping: nothing from 10.0.0.1:7174 within 2 s while waiting for ping [0-9]*'s .* (--timeout)$" "$dir/client.err"; then
    pass "a server killed mid-run: the client (-C 0) gives up after --timeout 2, exit 1"
  else
    fail "killed server (client rc $rc)"; show client.out client.err
  fi
else
  fail "the server did not start listening (kill)"; show server.out server.err
fi

# 9. Without -C the client pings until it is interrupted: SIGINT ends the
# run between pings, with the disconnect, exit 0 on both sides.
if start_server -V; then
  client -V >"$dir/client.out" 2>"$dir/client.err" &
  cpid=$!
  sleep 1
  kill -INT "$(pgrep -P "$cpid")" 2>/dev/null
  wait "$cpid"
  rc=$?
  wait_server
  n=$(sed -n 's/^rping: \([0-9]*\) ping(s) of 64 bytes with 10.0.0.1:7174 in .*, validated$/\1/p' "$dir/client.out")
  if [ "$rc" -eq 0 ] && [ "$server_rc" -eq 0 ] && [ -n "$n" ] && [ "$n" -gt 0 ] &&
    grep -q "disconnected after $n ping(s)" "$dir/server.err"; then
    pass "-C 0 until SIGINT: $n pings validated, both sides exit 0"
  else
    fail "-C 0 and SIGINT (client $rc, server $server_rc)"; show client.out client.err server.out server.err
  fi
else
  fail "the server did not start listening (SIGINT)"; show server.out server.err
fi

# 10. rping's limits and roles: usage errors, exit 2, nothing opened.
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

finish
