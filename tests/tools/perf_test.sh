#!/usr/bin/env bash
# Runs `ufab perf` against itself over a software NIC link (swnic:pfPID:0
# server at 10.0.0.1, swnic:pfPID:1 client at 10.0.0.2, the TCP exchange on
# 127.0.0.1 on a port the server picks with -p 0): all eight tests, -a,
# several QPs, -D, loss, --json; -R (perftest's rdma_cm mode: the exchange
# and the test QPs through ufab's connection manager on the swnic link),
# its text output and errors; FLUSH (write-lat/write-bw --flush,
# flush-lat, --flush persistent into a --pmem file, and their errors:
# options, a peer without the same --flush, a perftest peer, shm) and
# `ufab info` of a software device's RDMA caps; then the errors: bad
# options, a client without a server, mismatched tests on the two sides,
# and (with python3) a peer that is not perftest; then over the
# shared-memory provider
# (shm:pfPID..., no --ip): the tests, text output, errors, and write-bw,
# read-bw, send-bw with --use_cuda on the fake copy engine (--param
# gpu_copy=fake: host memory standing for GPU memory, every byte
# validated). The
# rxe/perftest interop runs in the VM suite rxe_interop
# (tests/vm/rxe_perftest_guest.sh).
#
# `bazel test //tests/tools:perf_test`, or from the repository root after
# `bazel build //tools/ufab`:
#   tests/tools/perf_test.sh [PATH_TO_UFAB]
set -uo pipefail

bin=${1:-}
if [ -z "$bin" ]; then
  for candidate in tools/ufab/ufab bazel-bin/tools/ufab/ufab; do
    if [ -x "$candidate" ]; then bin=$candidate; break; fi
  done
fi
if [ ! -x "$bin" ]; then
  echo "perf_test: no ufab binary (bazel build //tools/ufab)"
  exit 1
fi

dir=$(mktemp -d "${TEST_TMPDIR:-/tmp}/perf_test.XXXXXX")
link=pf$$
server_pid=
cleanup() {
  if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null; wait "$server_pid" 2>/dev/null; fi
  rm -rf "$dir"
  [ -z "${pmem_dir:-}" ] || rm -rf "$pmem_dir"
  rm -f "/dev/shm/ufab-swnic-$link"*
}
trap cleanup EXIT

passed=0 failed=0
pass() { passed=$((passed + 1)); echo "PASS $*"; }
fail() { failed=$((failed + 1)); echo "FAIL $*"; }
show() { for f in "$@"; do echo "--- $f"; sed 's/^/  | /' "$dir/$f" 2>/dev/null | tail -n 25; done; }

start_server() {
  rm -f "$dir/server.out" "$dir/server.err"
  timeout 120 "$bin" "$@" >"$dir/server.out" 2>"$dir/server.err" &
  server_pid=$!
  port=
  for _ in $(seq 200); do
    port=$(sed -n 's/.*waiting for a client on TCP port \([0-9][0-9]*\).*/\1/p' "$dir/server.err" 2>/dev/null)
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

# run NAME "SERVER OPTS" "CLIENT OPTS": both sides with --json; sets
# server_rc, client_rc; the JSON objects are in server.out / client.out.
run() {
  local name=$1 sopts=$2 copts=$3
  if ! start_server perf $sopts "swnic:$link$name:0" --ip 10.0.0.1 -p 0 --json --timeout 20; then
    fail "$name: the server did not start listening"; show server.err; return 1
  fi
  # shellcheck disable=SC2086
  timeout 120 "$bin" perf $copts "swnic:$link$name:1" --ip 10.0.0.2 -p "$port" --json --timeout 20 127.0.0.1 \
    >"$dir/client.out" 2>"$dir/client.err"
  client_rc=$?
  wait_server
  rm -f "/dev/shm/ufab-swnic-$link$name"
}
jq_ok() { jq -e "$1" "$dir/$2" >/dev/null 2>&1; }

# -------------------------------------------------------------- the tests
# TEST|OPTS|EXPECTED_SIZE|EXPECTED_ITERS (as the client reports them)
while IFS='|' read -r test opts size iters; do
  name="$test $opts"
  run "${test//-/}" "$test $opts" "$test $opts"
  why=()
  [ "$server_rc" -eq 0 ] || why+=("server exited $server_rc")
  [ "$client_rc" -eq 0 ] || why+=("client exited $client_rc")
  jq_ok ".ok == true and .test == \"$test\" and .role == \"client\"" client.out || why+=("client JSON")
  jq_ok ".ok == true and .role == \"server\"" server.out || why+=("server JSON")
  jq_ok ".results[-1].size == $size and .results[-1].iters == $iters" client.out ||
    why+=("client reports $(jq -c '[.results[-1].size, .results[-1].iters]' "$dir/client.out" 2>/dev/null), expected [$size,$iters]")
  jq_ok ".transport.rx_parse_errors == 0" client.out || why+=("client counted parse errors")
  case $test in
    *-lat) jq_ok ".results[-1].t_typical_usec > 0 and .results[-1].t_min_usec <= .results[-1].t_typical_usec" client.out ||
      why+=("latency figures") ;;
    *-bw) jq_ok ".results[-1].bw_avg > 0 and .results[-1].msg_rate_mpps > 0" client.out || why+=("bandwidth figures")
      # write/read/atomic: the server prints the client's report, received over TCP.
      case $test in send-bw) ;; *)
        jq_ok ".results[-1].bw_avg == $(jq '.results[-1].bw_avg' "$dir/client.out" 2>/dev/null || echo -1)" server.out ||
          why+=("the server's copy of the client's report differs") ;;
      esac ;;
  esac
  if [ ${#why[@]} -eq 0 ]; then pass "$name: both sides OK"; else fail "$name: ${why[*]}"; show server.err client.err client.out; fi
done <<'EOF'
write-lat|-n 200|2|200
write-lat|-s 5000 -n 50|5000|50
send-lat|-n 200|2|200
send-lat|-s 3000 -n 50|3000|50
read-lat|-s 64K -n 50|65536|50
atomic-lat|-n 200|8|200
atomic-lat|-A CMP_AND_SWAP -n 100|8|100
write-bw|-n 500|65536|500
write-bw|-s 64 -n 1000|64|1000
write-bw|-q 3 -s 1024 -n 300|1024|900
read-bw|-s 4096 -n 300|4096|300
send-bw|-s 1M -n 20|1048576|20
send-bw|-q 2 -s 256 -n 200|256|400
atomic-bw|-n 500|8|500
EOF

# --data_validation: the side a message lands on checks every byte of every
# message slot (32 slots of 100 bytes a QP; one 3000-byte slot; 2% loss), and
# says which bytes differ when the peer sent no pattern.
while IFS='|' read -r test opts slots; do
  run "dv${test//-/}" "$test --data_validation $opts" "$test --data_validation $opts"
  checker=server.out; [ "$test" = read-bw ] && checker=client.out
  bytes=$(jq -r '.validated_bytes' "$dir/$checker" 2>/dev/null)
  if [ "$server_rc" -eq 0 ] && [ "$client_rc" -eq 0 ] && [ "$bytes" = "$slots" ]; then
    pass "$test --data_validation $opts: $bytes bytes checked where they landed"
  else fail "$test --data_validation $opts (server $server_rc client $client_rc, validated $bytes, expected $slots)"
    show server.err client.err; fi
done <<'EOF'
write-bw|-s 100 -n 300 -q 2|6400
read-bw|-s 100 -n 300|3200
send-bw|-s 3000 -n 100|3000
write-bw|-s 1000 -n 300 --param loss=0.02|4000
read-bw|-s 5000 -n 100 --param loss=0.02|5000
EOF
run dvmiss "write-bw --data_validation -s 256 -n 100" "write-bw -s 256 -n 100"
if [ "$server_rc" -eq 1 ] && grep -q 'data_validation: QP 0, message slot 0: .* bytes differ.*both sides must run --data_validation' "$dir/server.err"; then
  pass "--data_validation against a peer sending no pattern: exit 1, says which bytes differ"
else fail "--data_validation without the peer's pattern (server $server_rc)"; show server.err; fi
for bad in "write-lat --data_validation" "write-bw --data_validation -a" "write-lat --use_cuda" "atomic-bw --use_cuda=0" \
           "write-bw --use_cuda -I 64" "write-bw --use_cuda=x"; do
  # shellcheck disable=SC2086
  "$bin" perf $bad "swnic:${link}x:0" --ip 10.0.0.1 >"$dir/e.out" 2>"$dir/e.err"
  rc=$?
  if [ "$rc" -eq 2 ] && grep -q -- '--\(data_validation\|use_cuda\)' "$dir/e.err"; then pass "perf $bad: usage error naming the option"
  else fail "perf $bad: expected a usage error (exit $rc)"; show e.err; fi
done
# Without a GPU (or a GPU build), --use_cuda says why before anything runs.
if ! "$bin" info gpu --json | jq -e .available >/dev/null; then
  "$bin" perf write-bw "swnic:${link}x:0" --ip 10.0.0.1 --use_cuda -p 0 >"$dir/e.out" 2>"$dir/e.err"
  rc=$?
  if [ "$rc" -eq 1 ] && grep -q -- '--use_cuda=0: ' "$dir/e.err" && ! grep -q 'waiting for a client' "$dir/e.err"; then
    pass "perf --use_cuda without a GPU: exit 1 before listening, says why"
  else fail "perf --use_cuda without a GPU (exit $rc)"; show e.err; fi
fi

# -a: one line per size, 2 .. 8 MiB.
run alllat "write-lat -a -n 5" "write-lat -a -n 5"
if [ "$client_rc" -eq 0 ] && [ "$server_rc" -eq 0 ] &&
  jq_ok '[.results[].size] == [range(1;24) | pow(2;.)]' client.out; then
  pass "write-lat -a: 23 sizes, 2 B to 8 MiB"
else fail "write-lat -a (server $server_rc client $client_rc)"; show client.err client.out; fi
run allsend "send-bw -a -n 5" "send-bw -a -n 5"
if [ "$client_rc" -eq 0 ] && [ "$server_rc" -eq 0 ] && jq_ok '(.results | length) == 23' client.out &&
  jq_ok '(.results | length) == 23' server.out; then
  pass "send-bw -a: both sides measured 23 sizes"
else fail "send-bw -a (server $server_rc client $client_rc)"; show client.err server.err; fi

# -D: by time; perftest's counts are those of the sample window.
run dur "write-bw -D 3 -s 4096" "write-bw -D 3 -s 4096"
if [ "$client_rc" -eq 0 ] && jq_ok '.duration_s == 3 and .results[0].iters > 0 and (.results[0] | has("bw_peak") | not)' client.out; then
  pass "write-bw -D 3: $(jq '.results[0].iters' "$dir/client.out") messages in the sample"
else fail "write-bw -D 3 (server $server_rc client $client_rc)"; show client.err client.out; fi
run durlat "send-lat -D 3" "send-lat -D 3"
if [ "$client_rc" -eq 0 ] && [ "$server_rc" -eq 0 ] && jq_ok '.results[0].iters > 0 and .results[0].tps > 0' client.out; then
  pass "send-lat -D 3: $(jq '.results[0].iters' "$dir/client.out") round trips"
else fail "send-lat -D 3 (server $server_rc client $client_rc)"; show client.err server.err client.out; fi

# Loss: 3% of frames dropped each way; the transport retransmits.
run loss "write-bw -s 16K -n 300 --param loss=0.03 --param seed=7" "write-bw -s 16K -n 300 --param loss=0.03 --param seed=9"
if [ "$client_rc" -eq 0 ] && [ "$server_rc" -eq 0 ] && jq_ok '.transport.retransmits > 0' client.out; then
  pass "write-bw with 3% loss: complete, $(jq '.transport.retransmits' "$dir/client.out") retransmissions"
else fail "write-bw with loss (server $server_rc client $client_rc)"; show client.err server.err; fi

# perftest's text output (no --json): the table perftest prints.
start_server perf read-lat "swnic:${link}txt:0" --ip 10.0.0.1 -p 0
timeout 60 "$bin" perf read-lat "swnic:${link}txt:1" --ip 10.0.0.2 -p "$port" -n 100 127.0.0.1 >"$dir/client.out" 2>"$dir/client.err"
client_rc=$?
wait_server
if [ "$client_rc" -eq 0 ] && grep -q '^                    RDMA_Read Latency Test$' "$dir/client.out" &&
  grep -q '^ #bytes #iterations    t_min\[usec\]' "$dir/client.out" &&
  grep -Eq '^ 2       100 +[0-9.]+ ' "$dir/client.out" &&
  grep -Eq '^ local address: LID 0000 QPN 0x[0-9a-f]+ PSN 0x[0-9a-f]+ OUT 0x10 RKey 0x[0-9a-f]+ VAddr 0x[0-9a-f]{14}$' "$dir/client.out" &&
  grep -q '^ GID: 00:00:00:00:00:00:00:00:00:00:255:255:10:00:00:02$' "$dir/client.out" &&
  grep -q 'Waiting for client to connect' "$dir/server.out"; then
  pass "text output in perftest's format"
else fail "text output (client $client_rc)"; show client.out client.err server.out; fi

# --------------------------------------------------------- -R (rdma_cm)
# perftest's -R: the exchange over an rdma_cm control connection and the
# test QPs connected by ufab's connection manager, both on the swnic link
# (10.0.0.1 is the server's RoCE address; rdma_cm port 18515, perftest's).
# run_cm NAME "SERVER OPTS" "CLIENT OPTS": as run, with -R.
run_cm() {
  local name=$1 sopts=$2 copts=$3
  rm -f "$dir/server.out" "$dir/server.err"
  # shellcheck disable=SC2086
  timeout 120 "$bin" perf $sopts "swnic:$link$name:0" --ip 10.0.0.1 -R --json --timeout 20 \
    >"$dir/server.out" 2>"$dir/server.err" &
  server_pid=$!
  local up=
  for _ in $(seq 200); do
    if grep -q "waiting for a client on rdma_cm port 18515 (10.0.0.1)" "$dir/server.err"; then up=1; break; fi
    kill -0 "$server_pid" 2>/dev/null || break
    sleep 0.05
  done
  [ -n "$up" ] || { fail "-R $name: the server did not say it waits on rdma_cm port 18515"; show server.err; }
  # shellcheck disable=SC2086
  timeout 120 "$bin" perf $copts "swnic:$link$name:1" --ip 10.0.0.2 -R --json --timeout 20 10.0.0.1 \
    >"$dir/client.out" 2>"$dir/client.err"
  client_rc=$?
  wait_server
  rm -f "/dev/shm/ufab-swnic-$link$name"
}
# TEST|OPTS|EXPECTED_SIZE|EXPECTED_ITERS (as the client reports them)
while IFS='|' read -r test opts size iters; do
  name="-R $test $opts"
  run_cm "cm${test//-/}" "$test $opts" "$test $opts"
  why=()
  [ "$server_rc" -eq 0 ] || why+=("server exited $server_rc")
  [ "$client_rc" -eq 0 ] || why+=("client exited $client_rc")
  jq_ok ".ok == true and .test == \"$test\" and .role == \"client\" and .rdma_cm == true" client.out || why+=("client JSON")
  jq_ok ".ok == true and .role == \"server\" and .rdma_cm == true" server.out || why+=("server JSON")
  jq_ok ".results[-1].size == $size and .results[-1].iters == $iters" client.out ||
    why+=("client reports $(jq -c '[.results[-1].size, .results[-1].iters]' "$dir/client.out" 2>/dev/null), expected [$size,$iters]")
  # The connection manager's path MTU: both swnic ports' 1024 (the default).
  jq_ok ".path_mtu == 1024" client.out && jq_ok ".path_mtu == 1024" server.out || why+=("path_mtu")
  jq_ok ".transport.rx_parse_errors == 0 and .transport.naks_received == 0" client.out || why+=("client counted parse errors or NAKs")
  case $test in
    *-lat) jq_ok ".results[-1].t_typical_usec > 0 and .results[-1].t_min_usec <= .results[-1].t_typical_usec and
                 .results[-1].t_typical_usec <= .results[-1].t_max_usec" client.out || why+=("latency figures") ;;
    *-bw) jq_ok ".results[-1].bw_avg > 0 and .results[-1].msg_rate_mpps > 0 and
                .results[-1].bw_avg <= .results[-1].bw_peak" client.out || why+=("bandwidth figures")
      # The server's copy of the client's report travelled over rdma_cm.
      case $test in send-bw) ;; *)
        jq_ok ".results[-1].bw_avg == $(jq '.results[-1].bw_avg' "$dir/client.out" 2>/dev/null || echo -1)" server.out ||
          why+=("the server's copy of the client's report differs") ;;
      esac ;;
  esac
  if [ ${#why[@]} -eq 0 ]; then pass "$name: both sides OK over rdma_cm"; else fail "$name: ${why[*]}"; show server.err client.err client.out; fi
done <<'EOF_CM'
write-bw|-n 500|65536|500
send-lat|-n 200|2|200
read-bw|-s 4096 -n 300|4096|300
write-lat|-n 200|2|200
read-lat|-s 64K -n 50|65536|50
send-bw|-q 2 -s 256 -n 200|256|400
atomic-bw|-n 300|8|300
write-bw|-q 3 -s 1024 -n 300|1024|900
EOF_CM

# -R, text output: perftest's banner says rdma_cm.
rm -f "$dir/server.out" "$dir/server.err"
timeout 60 "$bin" perf write-lat "swnic:${link}cmtxt:0" --ip 10.0.0.1 -R -n 50 --timeout 20 >"$dir/server.out" 2>"$dir/server.err" &
server_pid=$!
for _ in $(seq 200); do grep -q "waiting for a client on rdma_cm" "$dir/server.err" && break; sleep 0.05; done
timeout 60 "$bin" perf write-lat "swnic:${link}cmtxt:1" --ip 10.0.0.2 -R -n 50 --timeout 20 10.0.0.1 >"$dir/client.out" 2>"$dir/client.err"
client_rc=$?
wait_server
rm -f "/dev/shm/ufab-swnic-${link}cmtxt"
if [ "$client_rc" -eq 0 ] && [ "$server_rc" -eq 0 ] && grep -q '^ rdma_cm QPs	 : ON$' "$dir/client.out" &&
  grep -q '^ Data ex. method : rdma_cm$' "$dir/client.out" && grep -Eq '^ 2       50 +[0-9.]+ ' "$dir/client.out" &&
  grep -Eq '^ local address: LID 0000 QPN 0x[0-9a-f]+ PSN 0x[0-9a-f]+$' "$dir/client.out"; then
  pass "-R text output: rdma_cm QPs ON, data exchange rdma_cm, address lines without RKey/VAddr (perftest's -R)"
else fail "-R text output (client $client_rc server $server_rc)"; show client.out client.err server.err; fi

# -R errors: a port nobody listens on (the peer's CM answers REJ 8; ufab
# tries again until its timeout, then says so), and what -R refuses.
rm -f "$dir/server.out" "$dir/server.err"
timeout 60 "$bin" perf write-bw "swnic:${link}cmrej:0" --ip 10.0.0.1 -R --timeout 4 >"$dir/server.out" 2>"$dir/server.err" &
server_pid=$!
for _ in $(seq 200); do grep -q "waiting for a client on rdma_cm" "$dir/server.err" && break; sleep 0.05; done
t0=$SECONDS
timeout 60 "$bin" perf write-bw "swnic:${link}cmrej:1" --ip 10.0.0.2 -R -p 18516 --timeout 2 10.0.0.1 >"$dir/client.out" 2>"$dir/client.err"
client_rc=$?
took=$((SECONDS - t0))
wait_server
rm -f "/dev/shm/ufab-swnic-${link}cmrej"
if [ "$client_rc" -eq 1 ] && [ "$took" -le 10 ] &&
  grep -q "10.0.0.1 rdma_cm port 18516 rejected the rdma_cm connection (the control connection): reason 8 (nobody listening on port 18516)" "$dir/client.err" &&
  [ "$server_rc" -eq 1 ] && grep -q "no rdma_cm event for 4 s while waiting for a client" "$dir/server.err"; then
  pass "-R to a port nobody listens on: REJ 8, tried again for --timeout, then the reason (${took} s)"
else fail "-R REJ 8 (client $client_rc in $took s, server $server_rc)"; show client.err server.err; fi
expect_cm_refused() { # DESCRIPTION EXPECTED_TEXT ARGS...
  local what=$1 text=$2
  shift 2
  timeout 20 "$bin" perf "$@" >"$dir/e.out" 2>"$dir/e.err"
  local rc=$?
  if [ "$rc" -eq 2 ] && grep -qF -- "$text" "$dir/e.err"; then pass "-R refuses $what"; else fail "-R $what (rc $rc)"; show e.err; fi
}
expect_cm_refused "--flush" "the connection manager grants the QPs RDMA WRITE, READ and atomic access, not FLUSH" \
  write-bw "swnic:${link}cmx:0" --ip 10.0.0.1 -R --flush global
expect_cm_refused "-m" "the connection manager sets the path MTU" write-bw "swnic:${link}cmx:0" --ip 10.0.0.1 -R -m 512
expect_cm_refused "a server name that is not an address" "must be its RoCE IPv4 address" \
  write-bw "swnic:${link}cmx:1" --ip 10.0.0.2 -R localhost
expect_cm_refused "shm" "has no connection manager" write-bw "shm:${link}cmx" -R
rm -f "/dev/shm/ufab-swnic-${link}cmx"*

# ------------------------------------------------------------------ FLUSH
# --flush TYPE: a FLUSH of each WRITE's range behind it; flush-lat: one
# FLUSH at a time. Both sides get the same options.
# TEST|OPTS|EXPECTED_SIZE|EXPECTED_ITERS|EXPECTED_FLUSH
while IFS='|' read -r test opts size iters ftype; do
  name="$test $opts"
  run "fl${test//-/}" "$test $opts" "$test $opts"
  why=()
  [ "$server_rc" -eq 0 ] || why+=("server exited $server_rc")
  [ "$client_rc" -eq 0 ] || why+=("client exited $client_rc")
  jq_ok ".ok == true and .test == \"$test\" and .flush == \"$ftype\"" client.out || why+=("client JSON")
  jq_ok ".ok == true and .role == \"server\" and .flush == \"$ftype\"" server.out || why+=("server JSON")
  jq_ok ".results[-1].size == $size and .results[-1].iters == $iters" client.out ||
    why+=("client reports $(jq -c '[.results[-1].size, .results[-1].iters]' "$dir/client.out" 2>/dev/null), expected [$size,$iters]")
  case $test in
    *-lat) jq_ok ".results[-1].t_typical_usec > 0 and .results[-1].t_min_usec <= .results[-1].t_typical_usec" client.out ||
      why+=("latency figures") ;;
    *-bw) jq_ok ".results[-1].bw_avg > 0 and .results[-1].bw_avg == $(jq '.results[-1].bw_avg' "$dir/client.out" 2>/dev/null || echo -1)" server.out ||
      why+=("bandwidth figures, or the server's copy differs") ;;
  esac
  # The FLUSHes went on the wire: the client's RoCE frames outnumber what
  # the plain test sends (one request per message) by the FLUSHes and their
  # answers; each FLUSH is answered, so no NAK.
  jq_ok ".transport.naks_received == 0 and .transport.naks_sent == 0" client.out || why+=("NAKs counted")
  if [ ${#why[@]} -eq 0 ]; then pass "$name: both sides OK"; else fail "$name: ${why[*]}"; show server.err client.err client.out; fi
done <<'EOF_FLUSH'
write-lat|-n 200 --flush global|2|200|global
write-lat|-s 5000 -n 50 --flush global|5000|50|global
write-bw|-s 4096 -n 500 --flush global|4096|500|global
write-bw|-q 2 -s 64 -n 300 --flush global|64|600|global
flush-lat|-n 200|2|200|global
flush-lat|-s 1M -n 20 --flush global|1048576|20|global
EOF_FLUSH

# The FLUSHes are on the wire: write-bw with --flush sends twice the
# requests of write-bw without (a WRITE and a FLUSH per message).
run flplain "write-bw -s 64 -n 400 -Q 1" "write-bw -s 64 -n 400 -Q 1"
plain=$(jq '.transport.tx_frames' "$dir/client.out" 2>/dev/null || echo 0)
run flcount "write-bw -s 64 -n 400 -Q 1 --flush global" "write-bw -s 64 -n 400 -Q 1 --flush global"
flushed=$(jq '.transport.tx_frames' "$dir/client.out" 2>/dev/null || echo 0)
if [ "$client_rc" -eq 0 ] && [ "$plain" -ge 400 ] && [ "$flushed" -ge $((plain + 400)) ]; then
  pass "write-bw --flush global: $flushed frames sent against $plain without (400 FLUSHes more)"
else fail "write-bw --flush frame count: $flushed with, $plain without (client $client_rc)"; show client.err; fi

# Under loss: every FLUSH is retried until answered, the run completes.
run flloss "write-bw -s 8K -n 300 --flush global --param loss=0.03 --param seed=5" \
  "write-bw -s 8K -n 300 --flush global --param loss=0.03 --param seed=11"
if [ "$client_rc" -eq 0 ] && [ "$server_rc" -eq 0 ] && jq_ok '.transport.retransmits > 0' client.out; then
  pass "write-bw --flush global with 3% loss: complete, $(jq '.transport.retransmits' "$dir/client.out") retransmissions"
else fail "write-bw --flush with loss (server $server_rc client $client_rc)"; show client.err server.err; fi

# --flush persistent: the server's buffer is a --pmem file on a disk (the
# test's temporary directory: ext4 or the like, not tmpfs), registered as
# persistent memory; each FLUSH is an msync of its range there, and
# soft-RoCE says it offers that (`ufab info`).
pmem="$dir/pmem.file"
if [ "$(stat -f -c %T "$dir")" = tmpfs ]; then  # no durable memory there: a disk's temporary directory
  pmem_dir=$(mktemp -d "${UFAB_PMEM_DIR:-/var/tmp}/perf_test_pmem.XXXXXX")
  pmem="$pmem_dir/pmem.file"
fi
persistent=$("$bin" info --json "swnic:${link}cap:0" 2>/dev/null | jq -r '.rdma.flush_persistent and (.rdma.mem_types | index("persistent") != null)')
rm -f "/dev/shm/ufab-swnic-${link}cap"*
if [ "$persistent" = true ]; then pass "info: soft-RoCE offers FLUSH PERSISTENT and persistent memory"
else fail "info: soft-RoCE should offer FLUSH PERSISTENT and persistent memory (got '$persistent')"; fi
run flpm "write-bw -s 4096 -n 200 --flush persistent --pmem $pmem" "write-bw -s 4096 -n 200 --flush persistent"
if [ "$server_rc" -eq 0 ] && [ "$client_rc" -eq 0 ] && jq_ok '.flush == "persistent" and .results[-1].iters == 200' client.out &&
  jq_ok ".pmem == \"$pmem\" and (.memory | startswith(\"file\"))" server.out && [ "$(stat -c %s "$pmem")" -ge 8192 ]; then
  pass "write-bw --flush persistent into a --pmem file: both sides OK, the file holds the buffer"
else fail "write-bw --flush persistent --pmem (server $server_rc client $client_rc)"; show server.err client.err server.out; fi
run flpmlat "flush-lat -s 4096 -n 100 --flush persistent --pmem $pmem" "flush-lat -s 4096 -n 100 --flush persistent"
if [ "$server_rc" -eq 0 ] && [ "$client_rc" -eq 0 ] && jq_ok '.results[-1].iters == 100 and .results[-1].t_typical_usec > 0' client.out; then
  pass "flush-lat --flush persistent into a --pmem file"
else fail "flush-lat --flush persistent --pmem (server $server_rc client $client_rc)"; show server.err client.err; fi
# write-lat: each side's buffer a file; the last byte of every message is
# its iteration number, so after 100 the byte at the remote area's offset
# 1 (the areas are 4096 bytes: local, then remote) reads 100 in both files.
run flpmwl "write-lat -n 100 --flush persistent --pmem $pmem.s" "write-lat -n 100 --flush persistent --pmem $pmem.c"
if [ "$server_rc" -eq 0 ] && [ "$client_rc" -eq 0 ] && jq_ok '.results[-1].iters == 100' client.out &&
  [ "$(od -An -tu1 -j 4097 -N1 "$pmem.s" | tr -d ' ')" = 100 ] && [ "$(od -An -tu1 -j 4097 -N1 "$pmem.c" | tr -d ' ')" = 100 ]; then
  pass "write-lat --flush persistent, each side a --pmem file holding the peer's last message"
else fail "write-lat --flush persistent --pmem (server $server_rc client $client_rc)"; show server.err client.err; fi
# Where the provider refuses the memory, the server stops at registration,
# before it listens, and says why: tmpfs is no durable memory.
pmem_refused() { # DESCRIPTION PATH
  timeout 20 "$bin" perf write-bw "swnic:${link}pmr:0" --ip 10.0.0.1 -p 0 --timeout 2 --flush persistent --pmem "$2" \
    >"$dir/e.out" 2>"$dir/e.err"
  local rc=$?
  rm -f "/dev/shm/ufab-swnic-${link}pmr"*
  if [ "$rc" -eq 1 ] && grep -q "registering the [0-9]*-byte buffer ($2, file) as persistent memory with FLUSH_PERSISTENT: " "$dir/e.err" &&
    ! grep -q "waiting for a client" "$dir/e.err"; then
    pass "$1: the server's registration refuses it and says why"
  else fail "$1 (exit $rc)"; show e.err; fi
}
pmem_refused "--pmem on tmpfs" "/dev/shm/ufab-perf-$link"
rm -f "/dev/shm/ufab-perf-$link"

# A side with --flush and one without (or another type): both refuse right
# after the version exchange, saying what the other runs.
run flmm "write-bw -n 50" "write-bw -n 50 --flush global"
if [ "$server_rc" -eq 1 ] && [ "$client_rc" -eq 1 ] &&
  grep -q "the peer runs with --flush global, this side with none: give both sides the same --flush" "$dir/server.err" &&
  grep -q "the peer runs with no --flush, this side with --flush global" "$dir/client.err"; then
  pass "--flush on one side only: both refuse and say why"
else fail "--flush on one side only (server $server_rc client $client_rc)"; show server.err client.err; fi

# A perftest peer (python3 speaking perftest's first steps, version "6.06"
# padded with NULs as perftest's strncpy leaves it): no FLUSH there, so a
# --flush run stops after the version exchange, in either role, bounded.
if command -v python3 >/dev/null; then
  fake_perftest() { # ROLE PORTFILE|HOST:PORT
    python3 - "$@" <<'PY'
import socket, struct, sys, time
role, where = sys.argv[1], sys.argv[2]
if role == "server":
    s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(1)
    open(where, "w").write(str(s.getsockname()[1]))
    s.settimeout(30); c, _ = s.accept()
else:
    host, port = where.split(":")
    for _ in range(200):
        try:
            c = socket.create_connection((host, int(port))); break
        except OSError:
            time.sleep(0.05)
c.settimeout(30)
def swap(mine, n):  # perftest: the client writes first, the server reads first
    if role == "client": c.sendall(mine); got = c.recv(n)
    else: got = c.recv(n); c.sendall(mine)
    return got
swap(b"6.06".ljust(16, b"\0"), 16)
swap(struct.pack(">i", 4096), 4)
swap(struct.pack(">i", 64), 4)
swap(b"3\0", 2)
# perftest would now swap keys; hold until the peer hangs up.
try:
    c.recv(108)
except OSError:
    pass
PY
  }
  fake_perftest server "$dir/fakepf.port" &
  fake=$!
  for _ in $(seq 100); do [ -s "$dir/fakepf.port" ] && break; sleep 0.05; done
  timeout 30 "$bin" perf write-bw "swnic:${link}fp:1" --ip 10.0.0.2 --flush global -p "$(cat "$dir/fakepf.port")" --timeout 10 \
    127.0.0.1 >"$dir/e.out" 2>"$dir/e.err"
  rc=$?
  wait "$fake"
  if [ "$rc" -eq 1 ] && grep -q "the peer is not \`ufab perf\` (it announced perftest 6.06 without ufab's mark): perftest's tools .* have no FLUSH" "$dir/e.err"; then
    pass "--flush client against a perftest server: exit 1, says perftest has no FLUSH"
  else fail "--flush client against perftest (exit $rc)"; show e.err; fi
  start_server perf flush-lat "swnic:${link}fq:0" --ip 10.0.0.1 -p 0 --timeout 10
  fake_perftest client "127.0.0.1:$port" &
  fake=$!
  wait_server
  wait "$fake"
  if [ "$server_rc" -eq 1 ] && grep -q "perftest's tools .* have no FLUSH" "$dir/server.err"; then
    pass "flush-lat server against a perftest client: exit 1, says perftest has no FLUSH"
  else fail "flush-lat server against perftest (exit $server_rc)"; show server.err; fi
  rm -f "/dev/shm/ufab-swnic-${link}fp"* "/dev/shm/ufab-swnic-${link}fq"*
fi

# shm has no FLUSH: refused as the device opens, before any exchange.
timeout 20 "$bin" perf write-lat "shm:${link}flshm" --flush global -p 0 --timeout 2 >"$dir/e.out" 2>"$dir/e.err"
rc=$?
if [ "$rc" -eq 1 ] && grep -q "shm:${link}flshm (provider shm) has no FLUSH" "$dir/e.err" && ! grep -q "waiting for a client" "$dir/e.err"; then
  pass "--flush on shm: exit 1 before listening, says shm has no FLUSH"
else fail "--flush on shm (exit $rc)"; show e.err; fi

# `ufab info` of a software device: the RDMA device's caps, text and JSON.
"$bin" info --json "swnic:${link}inf:0" >"$dir/info.json" 2>"$dir/e.err"
rc=$?
if [ "$rc" -eq 0 ] && jq_ok '.ok and .rdma.provider == "soft-roce" and .rdma.flush_global == true and .rdma.atomic_write == true and
    (.rdma.caps | index("flush_global")) and (.rdma.mem_types | index("host")) and .rdma.ip == null and
    (.rdma.flush_persistent == ((.rdma.mem_types | index("persistent")) != null))' info.json; then
  pass "info --json swnic: soft-RoCE caps (flush_global, atomic_write, memory types)"
else fail "info --json swnic (exit $rc)"; show info.json e.err; fi
# `ufab info gpu`: the GPU support found. No GPU is a report with the
# reason (exit 0); a GPU machine lists its GPUs (tests/gpu/run.sh insists).
"$bin" info gpu --json >"$dir/gpu.json" 2>"$dir/e.err"
rc=$?
if [ "$rc" -eq 0 ] && jq_ok '.ok and (.built_with_cuda | type == "boolean") and
    (if .available then (.devices | length) > 0 else (.reason | length) > 0 and .devices == [] end)' gpu.json &&
  "$bin" info gpu >"$dir/gpu.txt" 2>>"$dir/e.err" && grep -q '^GPU support$' "$dir/gpu.txt" &&
  grep -q '^  driver: ' "$dir/gpu.txt"; then
  pass "info gpu: the GPU support found (available=$(jq -r .available "$dir/gpu.json"))"
else fail "info gpu (exit $rc)"; show gpu.json gpu.txt e.err; fi
"$bin" info "swnic:${link}inf:0" --ip 10.9.8.7 >"$dir/info.txt" 2>"$dir/e.err"
if grep -q "^    placement   flush global yes, flush persistent \(yes\|no\), atomic write yes$" "$dir/info.txt" &&
  grep -q "^    address     10.9.8.7$" "$dir/info.txt" && grep -q "^    memory      host" "$dir/info.txt"; then
  pass "info swnic: text shows the placement caps, memory types and --ip"
else fail "info swnic text"; show info.txt e.err; fi
rm -f "/dev/shm/ufab-swnic-${link}inf"*
"$bin" info --json "shm:${link}inf" >"$dir/info.json" 2>"$dir/e.err"
if jq_ok '.rdma.provider == "shm" and .rdma.flush_global == false and .rdma.flush_persistent == false and .rdma.atomic_write == false' info.json; then
  pass "info --json shm: no FLUSH, no ATOMIC_WRITE"
else fail "info --json shm"; show info.json e.err; fi

# ------------------------------------------------ the shared-memory provider
# shm:DOMAIN: no --ip; the GID carries the device's endpoint id. Both sides
# are processes of this host, the exchange on loopback.
run_shm() { # NAME "OPTS": like run, both sides with the same options
  local name=$1 opts=$2
  # shellcheck disable=SC2086
  if ! start_server perf $opts "shm:$link$name" -p 0 --json --timeout 20; then
    fail "shm $name: the server did not start listening"; show server.err; return 1
  fi
  # shellcheck disable=SC2086
  timeout 120 "$bin" perf $opts "shm:$link$name" -p "$port" --json --timeout 20 127.0.0.1 \
    >"$dir/client.out" 2>"$dir/client.err"
  client_rc=$?
  wait_server
}
# TEST|OPTS|EXPECTED_SIZE|EXPECTED_ITERS
while IFS='|' read -r test opts size iters; do
  name="shm $test $opts"
  run_shm "${test//-/}" "$test $opts"
  why=()
  [ "$server_rc" -eq 0 ] || why+=("server exited $server_rc")
  [ "$client_rc" -eq 0 ] || why+=("client exited $client_rc")
  jq_ok ".ok == true and .test == \"$test\" and .role == \"client\" and (.device | startswith(\"shm:\"))" client.out ||
    why+=("client JSON")
  jq_ok ".ok == true and .role == \"server\"" server.out || why+=("server JSON")
  jq_ok ".results[-1].size == $size and .results[-1].iters == $iters" client.out ||
    why+=("client reports $(jq -c '[.results[-1].size, .results[-1].iters]' "$dir/client.out" 2>/dev/null), expected [$size,$iters]")
  jq_ok ".transport.tx_frames > 0" client.out || why+=("the client's transport counted no messages")
  # Sane: positive, ordered, and within what a loopback run can take (no
  # speed is asserted).
  case $test in
    *-lat) jq_ok '.results[-1] | .t_typical_usec > 0 and .t_min_usec <= .t_typical_usec and
                  .t_typical_usec <= .t_max_usec and .t_typical_usec < 1e6' client.out || why+=("latency figures") ;;
    *-bw) jq_ok '.results[-1] | .bw_avg > 0 and .msg_rate_mpps > 0 and .bw_avg < 1e7' client.out ||
      why+=("bandwidth figures")
      case $test in send-bw) ;; *)
        jq_ok ".results[-1].bw_avg == $(jq '.results[-1].bw_avg' "$dir/client.out" 2>/dev/null || echo -1)" server.out ||
          why+=("the server's copy of the client's report differs") ;;
      esac ;;
  esac
  if [ ${#why[@]} -eq 0 ]; then pass "$name: both sides OK"; else fail "$name: ${why[*]}"; show server.err client.err client.out; fi
done <<'SHM'
write-lat|-s 8 -n 500|8|500
write-lat|-s 64K -n 50|65536|50
write-bw|-s 64 -n 2000|64|2000
write-bw|-s 1M -n 50|1048576|50
write-bw|-q 2 -s 4096 -n 300|4096|600
send-lat|-s 8 -n 500|8|500
send-lat|-s 3000 -n 50|3000|50
send-bw|-s 4096 -n 300|4096|300
read-lat|-s 4096 -n 100|4096|100
read-bw|-s 64K -n 200|65536|200
atomic-lat|-n 300|8|300
atomic-lat|-A CMP_AND_SWAP -n 100|8|100
atomic-bw|-n 500|8|500
write-bw|--use_cuda --param gpu_copy=fake --param gpu_frag=8192 --data_validation -s 1M -n 50|1048576|50
write-bw|--use_cuda --param gpu_copy=fake --data_validation -s 4097 -n 300|4097|300
read-bw|--use_cuda --param gpu_copy=fake --param gpu_frag=8192 --data_validation -s 64K -n 100|65536|100
send-bw|--use_cuda --param gpu_copy=fake --param gpu_frag=8192 --data_validation -s 100000 -n 100|100000|100
SHM

# The text output: each side's GID is ::ffff: and its endpoint id, not an
# address given with --ip.
start_server perf write-lat "shm:${link}shmtxt" -p 0 -n 100
timeout 60 "$bin" perf write-lat "shm:${link}shmtxt" -p "$port" -n 100 127.0.0.1 >"$dir/client.out" 2>"$dir/client.err"
client_rc=$?
wait_server
if [ "$client_rc" -eq 0 ] && [ "$server_rc" -eq 0 ] && grep -q '^                    RDMA_Write Latency Test$' "$dir/client.out" &&
  [ "$(grep -Ec '^ GID: 00:00:00:00:00:00:00:00:00:00:255:255(:[0-9]{2,3}){4}$' "$dir/client.out")" -eq 2 ] &&
  [ "$(grep '^ GID: ' "$dir/client.out" | sort -u | wc -l)" -eq 2 ]; then
  pass "shm: text output, two different ::ffff:<endpoint id> GIDs"
else fail "shm text output (server $server_rc client $client_rc)"; show client.out client.err server.err; fi

# A client with no server on shm: bounded, names what it tried.
timeout 20 "$bin" perf write-lat "shm:${link}shmns" -p 1 --timeout 2 127.0.0.1 >"$dir/e.out" 2>"$dir/e.err"
rc=$?
if [ "$rc" -eq 1 ] && grep -q '127.0.0.1:1' "$dir/e.err"; then pass "shm, no server: exit 1 naming 127.0.0.1:1"
else fail "shm, no server (exit $rc)"; show e.err; fi

# Mismatched tests over shm (write-lat against read-lat): a one-sided
# request is refused by its initiator's check of the target QP's rights
# (whichever side starts first); both sides fail, one says why, the other
# that its peer went away.
start_server perf write-lat "shm:${link}shmmm" -p 0 --timeout 3
timeout 60 "$bin" perf read-lat "shm:${link}shmmm" -p "$port" --timeout 3 -n 20 127.0.0.1 >"$dir/client.out" 2>"$dir/client.err"
client_rc=$?
wait_server
if [ "$server_rc" -eq 1 ] && [ "$client_rc" -eq 1 ] && grep -q "does not allow REMOTE_\(READ\|WRITE\)" "$dir/server.err" "$dir/client.err"; then
  pass "shm, mismatched tests: both sides fail and say why"
else fail "shm, mismatched tests (server $server_rc client $client_rc)"; show server.err client.err; fi

# ------------------------------------------------------------------ errors
expect_usage() { # DESCRIPTION EXPECTED_TEXT ARGS...
  local what=$1 text=$2
  shift 2
  timeout 10 "$bin" "$@" >"$dir/e.out" 2>"$dir/e.err"
  local rc=$?
  if [ "$rc" -eq 2 ] && grep -q -- "$text" "$dir/e.err"; then pass "usage error: $what"
  else fail "usage error: $what (exit $rc)"; show e.err; fi
}
expect_usage "unknown test" "unknown test 'write-latency'" perf write-latency swnic:x:0 --ip 10.0.0.1
expect_usage "missing --ip" "--ip A.B.C.D is required" perf write-lat swnic:x:0
expect_usage "--ip on shm" "is a shared-memory device" perf write-lat shm:x --ip 10.0.0.1
expect_usage "-x other than 0" "one GID, index 0" perf write-lat swnic:x:0 --ip 10.0.0.1 -x 3
expect_usage "-q on a latency test" "multiple QPs only in the bandwidth tests" perf send-lat swnic:x:0 --ip 10.0.0.1 -q 2
expect_usage "-s on an atomic test" "cannot be changed" perf atomic-bw swnic:x:0 --ip 10.0.0.1 -s 16
expect_usage "-a with -D" "duration mode runs one size" perf write-bw swnic:x:0 --ip 10.0.0.1 -a -D 5
expect_usage "-n below perftest's 5" "--iters 2" perf write-bw swnic:x:0 --ip 10.0.0.1 -n 2
expect_usage "bad -A" "expected CMP_AND_SWAP or FETCH_AND_ADD" perf atomic-lat swnic:x:0 --ip 10.0.0.1 -A SWAP
expect_usage "-a on pingpong" "applies only to" pingpong swnic:x:0 --ip 10.0.0.1 -a
expect_usage "--flush of an unknown type" "--flush durable: expected global or persistent" perf write-lat swnic:x:0 --ip 10.0.0.1 --flush durable
for t in read-lat read-bw send-lat send-bw atomic-lat atomic-bw; do
  expect_usage "--flush on $t" "--flush applies to write-lat, write-bw .* and flush-lat; $t has no WRITE" \
    perf "$t" swnic:x:0 --ip 10.0.0.1 --flush global
done
expect_usage "--flush persistent on a server without --pmem" "--flush persistent: the client flushes this server's buffer, which must be durable memory: give --pmem PATH" \
  perf write-bw swnic:x:0 --ip 10.0.0.1 --flush persistent
expect_usage "write-lat --flush persistent on a client without --pmem" "in write-lat the server flushes this client's buffer too" \
  perf write-lat swnic:x:0 --ip 10.0.0.1 --flush persistent 127.0.0.1
expect_usage "--pmem with no path" "--pmem: expected a path" perf write-bw swnic:x:0 --ip 10.0.0.1 --pmem ""
expect_usage "-I on flush-lat" "inline data is for WRITE and SEND" perf flush-lat swnic:x:0 --ip 10.0.0.1 -I 64
expect_usage "-q on flush-lat" "multiple QPs only in the bandwidth tests" perf flush-lat swnic:x:0 --ip 10.0.0.1 -q 2

# A client with no server: bounded by --timeout, says what it tried.
timeout 20 "$bin" perf write-bw "swnic:${link}ns:1" --ip 10.0.0.2 -p 1 --timeout 2 127.0.0.1 >"$dir/e.out" 2>"$dir/e.err"
rc=$?
if [ "$rc" -eq 1 ] && grep -q '127.0.0.1:1' "$dir/e.err"; then pass "no server: exit 1 naming 127.0.0.1:1"
else fail "no server (exit $rc)"; show e.err; fi

# The two sides run different tests (write-lat against read-lat): each QP
# refuses the other's requests (no REMOTE_READ, no REMOTE_WRITE), both fail
# with the reason.
start_server perf write-lat "swnic:${link}mm:0" --ip 10.0.0.1 -p 0 --timeout 3
timeout 60 "$bin" perf read-lat "swnic:${link}mm:1" --ip 10.0.0.2 -p "$port" --timeout 3 -n 20 127.0.0.1 >"$dir/client.out" 2>"$dir/client.err"
client_rc=$?
wait_server
# Whichever request arrives first is refused (its sender may see the NAK,
# or its own QP in ERROR first).
if [ "$server_rc" -eq 1 ] && [ "$client_rc" -eq 1 ] &&
  grep -q "without REMOTE_\(READ\|WRITE\) access" "$dir/server.err" "$dir/client.err"; then
  pass "mismatched tests: both sides fail and say why"
else fail "mismatched tests (server $server_rc client $client_rc)"; show server.err client.err; fi

# A peer that is not perftest (python3: speaks something else on the port).
if command -v python3 >/dev/null; then
  python3 - "$dir/fake.port" <<'PY' &
import socket, sys
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(1)
open(sys.argv[1], "w").write(str(s.getsockname()[1]))
c, _ = s.accept(); c.recv(16); c.sendall(b"HTTP/1.1 400 Bad\r\n"); c.close()
PY
  fake=$!
  for _ in $(seq 100); do [ -s "$dir/fake.port" ] && break; sleep 0.05; done
  timeout 20 "$bin" perf write-lat "swnic:${link}fk:1" --ip 10.0.0.2 -p "$(cat "$dir/fake.port")" --timeout 5 127.0.0.1 \
    >"$dir/e.out" 2>"$dir/e.err"
  rc=$?
  wait "$fake"
  if [ "$rc" -eq 1 ] && grep -q "perftest" "$dir/e.err"; then pass "a peer that is not perftest: exit 1, says so"
  else fail "not-perftest peer (exit $rc)"; show e.err; fi
fi

echo "perf_test: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
