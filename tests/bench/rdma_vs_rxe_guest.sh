#!/usr/bin/env bash
# Runs inside the VMs of tests/bench/rdma_vs_rxe.sh (a benchmark, not a
# test). ROLE says which:
#
#   A, B  the two VMs, whose hubs are joined (run-vm --hub-link). A serves,
#         B is the client; both walk the same list of runs in the same
#         order, run k on TCP port BENCH_PORT+k. In each VM:
#           NIC 1 (00:02.0)  vfio-pci, ufab's port: 10.0.0.1 (A), 10.0.0.2 (B)
#           NIC 2 (00:03.0)  kernel e1000e: 10.0.1.1 (A), 10.0.1.2 (B), with
#                            rxe0 on it; every TCP exchange (perftest's and
#                            ufab's) goes over it
#         For each size, rxe <-> rxe (perftest 6.06 on both sides) and then
#         ufab <-> ufab (`ufab perf`, the same options and defaults).
#   ONE   one VM with NIC 1 and NIC 2 both on vfio-pci: the raw frame rate
#         of that NIC model (`ufab pktgen`, frames of a 64-byte WRITE's size)
#         and ufab <-> ufab between its two NICs (one process per vCPU, TCP
#         over 127.0.0.1), the same runs as above.
#
# Prints progress lines ("bench A: ...") and one "RESULT <json>" line per
# measurement (from the client: B, or ONE). Environment: ROLE and UFAB_BIN
# (required); BENCH_STACKS, BENCH_LAT_SIZES, BENCH_BW_SIZES,
# BENCH_LAT_ITERS, BENCH_LAT_BYTES, BENCH_BW_ITERS, BENCH_BW_BYTES,
# BENCH_REPEAT, BENCH_RUN_LIMIT, BENCH_CEILING_SECS as in
# tests/bench/rdma_vs_rxe.sh; BENCH_CONNECT_WAIT (180: seconds B's client
# retries a refused connection), BENCH_PORT (18600: the first run's TCP
# port).
set -uo pipefail
role=${ROLE:?ROLE=A, B or ONE}
ufab=${UFAB_BIN:?set UFAB_BIN to the ufab binary}
stacks=${BENCH_STACKS:-rxe ufab}
lat_sizes=${BENCH_LAT_SIZES:-8 64 512 4096 65536}
bw_sizes=${BENCH_BW_SIZES:-64 512 4096 65536 1048576}
lat_iters=${BENCH_LAT_ITERS:-1000}
lat_bytes=${BENCH_LAT_BYTES:-8388608}
bw_iters=${BENCH_BW_ITERS:-20000}
bw_bytes=${BENCH_BW_BYTES:-33554432}
repeat=${BENCH_REPEAT:-1}
limit=${BENCH_RUN_LIMIT:-150}
connect_wait=${BENCH_CONNECT_WAIT:-180}
ceiling_secs=${BENCH_CEILING_SECS:-5}
port0=${BENCH_PORT:-18600}
nic1=0000:00:02.0
nic2=0000:00:03.0
case $role in
  A) me=1 setup=2vm ;;
  B) me=2 setup=2vm ;;
  ONE) me=1 setup=1vm stacks=ufab ;;
  *) echo "ROLE must be A, B or ONE" >&2; exit 2 ;;
esac

say() { printf 'bench %s: %s\n' "$role" "$*"; }
die() { say "error: $*"; exit 1; }
w=$(mktemp -d)
trap 'rm -rf "$w"' EXIT

# ------------------------------------------------------------------ setup
# A task blocked in the kernel for 30 s is reported, with its stack, on
# the serial console, which the host script shows when a VM stalls (a
# guest that stops making progress altogether has been seen here twice).
echo 30 >/proc/sys/kernel/hung_task_timeout_secs 2>/dev/null
dmesg -n 7 2>/dev/null
timeout 60 modprobe vfio-pci || die "modprobe vfio-pci"
timeout 60 "$ufab" bind "$nic1" >/dev/null || die "ufab bind $nic1"
gid_index=
if [ "$role" = ONE ]; then
  timeout 60 "$ufab" bind "$nic2" >/dev/null || die "ufab bind $nic2"
  say "$(nproc) vCPU; ufab on $nic1 (10.0.0.1) and $nic2 (10.0.0.2)"
else
  ifname=$(basename "$(echo /sys/bus/pci/devices/$nic2/net/*)")
  [ -e "/sys/class/net/$ifname" ] || die "no kernel interface on $nic2"
  { ip addr add "10.0.1.$me/24" dev "$ifname" && ip link set "$ifname" up; } || die "ip setup of $ifname"
  if [[ " $stacks " == *" rxe "* ]]; then
    # rxe computes its ICRC through the crypto API's "crc32", which this
    # guest does not load on demand (tests/vm/rxe_capture_guest.sh).
    { timeout 60 modprobe crc32_generic && timeout 60 modprobe rdma_rxe; } || die "modprobe crc32_generic rdma_rxe"
    timeout 20 rdma link add rxe0 type rxe netdev "$ifname" || die "rdma link add rxe0 netdev $ifname"
    # The RoCE v2 GID of ::ffff:10.0.1.$me (rxe adds it once the address
    # and the link are up).
    want=$(printf '0000:0000:0000:0000:0000:ffff:0a00:01%02x' "$me")
    for _ in $(seq 100); do
      for f in /sys/class/infiniband/rxe0/ports/1/gids/*; do
        n=${f##*/}
        [ "$(cat "$f" 2>/dev/null)" = "$want" ] || continue
        [ "$(cat "/sys/class/infiniband/rxe0/ports/1/gid_attrs/types/$n" 2>/dev/null)" = "RoCE v2" ] || continue
        gid_index=$n
        break
      done
      [ -z "$gid_index" ] || break
      sleep 0.1
    done
    [ -n "$gid_index" ] || die "no RoCE v2 GID $want on rxe0 within 10 s"
  fi
  say "$(nproc) vCPU; ufab on $nic1 (10.0.0.$me); $ifname 10.0.1.$me${gid_index:+, rxe0 GID index $gid_index}"
fi

# -------------------------------------------------------------- helpers
iters_for() { # KIND SIZE: the iterations of a run: a byte budget, capped
  local n
  if [ "$1" = lat ]; then
    n=$((lat_bytes / $2)); ((n > lat_iters)) && n=$lat_iters
  else
    n=$((bw_bytes / $2)); ((n > bw_iters)) && n=$bw_iters
  fi
  ((n < 20)) && n=20
  echo "$n"
}

# perftest's result line: the first line after its "#bytes" header that
# starts with two numbers.
perftest_line() { awk '/#bytes/ { t = 1; next } t && $1 ~ /^[0-9]+$/ && $2 ~ /^[0-9]+$/ { print; exit }' "$1"; }

# result STACK TEST SIZE ITERS SECONDS: the RESULT object of the client's
# output in $w/out (perftest's text or ufab's JSON), for repetition $rep.
result() {
  local stack=$1 test=$2 size=$3 iters=$4 secs=$5 l f r
  r=$(result_object "$@") && [ -n "$r" ] || return 1
  jq -c --argjson rep "$rep" '. + {rep: $rep}' <<<"$r"
}
result_object() {
  local stack=$1 test=$2 size=$3 iters=$4 secs=$5 l f
  if [ "$stack" = rxe ]; then
    l=$(perftest_line "$w/out")
    [ -n "$l" ] || return 1
    read -r -a f <<<"$l"
    if [ "$test" = write-lat ]; then
      # bytes iters t_min t_max t_typical t_avg t_stdev p99 p99.9
      jq -nc --arg su "$setup" --arg st "$stack" --arg t "$test" --argjson s "$size" --argjson n "$iters" \
        --argjson secs "$secs" --argjson typ "${f[4]}" --argjson avg "${f[5]}" --argjson p99 "${f[7]}" \
        '{setup: $su, stack: $st, test: $t, size: $s, iters: $n, seconds: $secs,
          t_typical_usec: $typ, t_avg_usec: $avg, p99_usec: $p99}'
    else
      # bytes iters bw_peak bw_avg msg_rate
      jq -nc --arg su "$setup" --arg st "$stack" --arg t "$test" --argjson s "$size" --argjson n "$iters" \
        --argjson secs "$secs" --argjson bw "${f[3]}" --argjson mr "${f[4]}" \
        '{setup: $su, stack: $st, test: $t, size: $s, iters: $n, seconds: $secs,
          bw_avg_mib: $bw, msg_rate_mpps: $mr}'
    fi
  else
    jq -ce --arg su "$setup" --arg st "$stack" --arg t "$test" --argjson secs "$secs" \
      'select(.ok == true) | .results[0] as $r
       | {setup: $su, stack: $st, test: $t, size: $r.size, iters: $r.iters, seconds: $secs,
          retransmits: .transport.retransmits, timeouts: .transport.timeouts}
         + (if $t == "write-lat" then {t_typical_usec: $r.t_typical_usec, t_avg_usec: $r.t_avg_usec, p99_usec: $r.p99_usec}
            else {bw_avg_mib: $r.bw_avg, msg_rate_mpps: $r.msg_rate_mpps} end)' "$w/out"
  fi
}

# bounded OUT ERR CMD...: runs CMD with stdout OUT and stderr ERR for at
# most $limit seconds; returns its status, 124 when it had to be stopped.
# A run that overstays is described before it is stopped (process state,
# wait channel, kernel stacks): a hang in ufab should be reported, not
# hidden.
bounded() {
  local out=$1 err=$2 pid k t
  shift 2
  "$@" >"$out" 2>"$err" &
  pid=$!
  local deadline=$((SECONDS + limit))
  while ((SECONDS < deadline)); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.2
  done
  if kill -0 "$pid" 2>/dev/null; then
    say "still running after $limit s, stopping it: $*"
    for t in /proc/"$pid"/task/*; do
      echo "  | task ${t##*/}: $(awk '{ print "state " $3 }' "$t/stat" 2>/dev/null), wchan $(cat "$t/wchan" 2>/dev/null)"
      sed 's/^/  |   /' "$t/stack" 2>/dev/null | head -n 12
    done
    tails "$out" "$err"
    kill -TERM "$pid" 2>/dev/null
    for ((k = 0; k < 50; k++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && { say "it ignored SIGTERM for 5 s: SIGKILL"; kill -KILL "$pid" 2>/dev/null; }
    wait "$pid" 2>/dev/null
    return 124
  fi
  wait "$pid"
}

# tails FILE...: the last lines of a side's output, without perftest's
# banner and address lines
tails() {
  local f
  for f in "$@"; do
    [ -s "$f" ] || continue
    echo "  | --- ${f##*/}"
    grep -v '^ \|^-\{20\}\|^\*' "$f" | tail -n 8 | sed 's/^/  | /'
  done
}

report() { # STACK TEST SIZE ITERS T0
  local r
  if r=$(result "$1" "$2" "$3" "$4" $((SECONDS - $5))); then
    echo "RESULT $r"
    say "$1 $2 $3 B x $4${rep_label}: $(jq -r 'if .t_typical_usec then "t_typical \(.t_typical_usec) us"
      else "\(.bw_avg_mib) MiB/s, \(.msg_rate_mpps * 1e6 | floor) msg/s" end' <<<"$r") ($((SECONDS - $5)) s)"
  else
    say "$1 $2 $3 B x $4${rep_label}: no result from the client ($((SECONDS - $5)) s)"
    tails "$w/out" "$w/err" "$w/srv" "$w/srv.err"
  fi
}

# run K STACK TEST SIZE: one run on TCP port BENCH_PORT+K.
run() {
  local k=$1 stack=$2 test=$3 size=$4 kind=${3##*-} port=$(($1 + port0)) n t0=$SECONDS rc
  local cmd srv cli
  n=$(iters_for "$kind" "$size")
  if [ "$stack" = rxe ]; then
    # stdbuf: perftest's output survives a kill
    cmd=(stdbuf -oL "ib_${test//-/_}" -d rxe0 -x "$gid_index" -F -s "$size" -n "$n" -p "$port")
  else
    cmd=("$ufab" perf "$test" "$nic1" --ip "10.0.0.$me" -s "$size" -n "$n" -p "$port" --timeout 60 --json)
  fi

  if [ "$role" = ONE ]; then
    # Server on NIC 1 and vCPU 0, client on NIC 2 and the last vCPU.
    srv=(taskset -c 0 "${cmd[@]}")
    cli=(taskset -c $(($(nproc) - 1)) "$ufab" perf "$test" "$nic2" --ip 10.0.0.2 -s "$size" -n "$n" -p "$port"
      --timeout 60 --json 127.0.0.1)
    rm -f "$w/srv" "$w/srv.err"
    bounded "$w/srv" "$w/srv.err" "${srv[@]}" &
    local spid=$!
    bounded "$w/out" "$w/err" "${cli[@]}"
    rc=$?
    wait "$spid"
    [ "$rc" = 0 ] || say "$stack $test $size B: client exited with $rc$( ((rc == 124)) && echo " (stopped after $limit s)")"
    report "$stack" "$test" "$size" "$n" "$t0"
    return
  fi

  if [ "$role" = A ]; then
    say "$stack $test $size B x $n: serving on TCP port $port"
    bounded "$w/out" "$w/err" "${cmd[@]}"
    rc=$?
    [ "$rc" = 0 ] || { say "$stack $test $size B: server exited with $rc"; tails "$w/out" "$w/err"; }
    return
  fi
  # B, the client. The server may not listen yet (VM A still booting, or
  # finishing the run before): retry while refused. perftest's client does
  # not retry; ufab's retries for its --timeout.
  cmd+=(10.0.1.1)
  while :; do
    bounded "$w/out" "$w/err" "${cmd[@]}"
    rc=$?
    [ "$rc" = 0 ] && break
    if grep -qi "Couldn't connect\|connection refused" "$w/err" && ((SECONDS - t0 < connect_wait)); then
      sleep 1
      continue
    fi
    say "$stack $test $size B: client exited with $rc"
    break
  done
  report "$stack" "$test" "$size" "$n" "$t0"
}

# ------------------------------------------------------------------ runs
if [ "$role" = ONE ] && [ "$ceiling_secs" != 0 ]; then
  # The frame a 64-byte RDMA WRITE takes: Ethernet 14 + IPv4 20 + UDP 8 +
  # BTH 12 + RETH 16 + 64 payload + ICRC 4 = 138 bytes (without the FCS,
  # as pktgen counts). One thread sends on NIC 1 and receives on NIC 2.
  for ((rep = 1; rep <= repeat; rep++)); do
    say "raw frames: ufab pktgen $nic1 -> $nic2, 138-byte frames, $ceiling_secs s (run $rep of $repeat)"
    r=$(timeout 120 "$ufab" pktgen "$nic1" "$nic2" --duration "$ceiling_secs" --size 138 --burst 32 --verify header --json)
    fps=$(jq -r '.frames_per_second // 0' <<<"$r" 2>/dev/null)
    lost=$(jq -r '.lost // 0' <<<"$r" 2>/dev/null)
    echo "RESULT $(jq -nc --argjson fps "${fps:-0}" --argjson secs "$ceiling_secs" --argjson lost "${lost:-0}" --argjson rep "$rep" \
      '{setup: "1vm", stack: "ufab-pktgen", test: "raw-frames", size: 138, seconds: $secs, frames_per_second: $fps,
        lost: $lost, rep: $rep}')"
    say "raw frames: $(printf '%.0f' "${fps:-0}") frames/s, $lost lost"
  done
fi

# Size by size, each stack's run in turn, BENCH_REPEAT times: the stacks
# see the same host load, as far as a shared host allows.
k=0
for test in write-lat write-bw; do
  sizes=$lat_sizes
  [ "$test" = write-bw ] && sizes=$bw_sizes
  for s in $sizes; do
    for ((rep = 1; rep <= repeat; rep++)); do
      rep_label=
      ((repeat > 1)) && rep_label=" (run $rep of $repeat)"
      for stack in $stacks; do run $k "$stack" "$test" "$s"; k=$((k + 1)); done
    done
  done
done
say "done"
