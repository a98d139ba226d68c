# Sourced by the benchmarks that compare with UCX (rdma_vs_rxe.sh,
# shm_vs_ucx.sh): one ucx_perftest measurement over UCT's posix shared
# memory, the server on CPU $cpu_a, the client on $cpu_b, output in $w.
#
#   ucx_pair TEST SIZE N TIMEOUT_S    e.g. ucx_pair put_lat 8 100000 300
#
# Returns 0 and sets ucx_fields to the client's result line (-f -v: a CSV
# of iterations, 50.0_percentile_lat, avg_lat, overall_lat, avg_bw,
# overall_bw, avg_mr, overall_mr; us, MiB/s, messages/s), or returns
# non-zero with the client's output in $w/c.out.

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

ucx_pair() {
  local t=$1 size=$2 n=$3 limit=$4 port spid rc=0 line
  ucx_fields=()
  port=$(free_port)
  timeout -k 5 "$limit" taskset -c "$cpu_a" ucx_perftest -x posix -d memory -p "$port" >"$w/s.out" 2>&1 &
  spid=$!
  for _ in $(seq 300); do  # the client connects once the server listens
    [ -n "$(ss -Hltn "sport = :$port" 2>/dev/null)" ] && break
    kill -0 "$spid" 2>/dev/null || break
    sleep 0.1
  done
  timeout -k 5 "$limit" taskset -c "$cpu_b" ucx_perftest 127.0.0.1 -p "$port" -x posix -d memory -t "$t" -s "$size" \
    -n "$n" -f -v >"$w/c.out" 2>&1 || rc=$?
  wait "$spid" || true
  line=$(grep -E '^[0-9]+,' "$w/c.out" | tail -n 1)
  [ "$rc" = 0 ] && [ -n "$line" ] || return "$((rc == 0 ? 1 : rc))"
  IFS=, read -r -a ucx_fields <<<"$line"
}
