#!/usr/bin/env bash
# Runs in the VM, called by tests/vm/rxe_interop_guest.sh at its end (same
# boot, its setup done): perftest's eight RC tests (ib_write_lat,
# ib_write_bw, ib_read_lat, ib_read_bw, ib_send_lat, ib_send_bw,
# ib_atomic_lat, ib_atomic_bw; perftest 6.06, Debian's perftest package) on
# Linux soft-RoCE (rxe0) against `ufab perf` on NIC 1, in both roles, then
# some of them with 2% loss. Each run is one perftest process and one ufab
# process; their TCP exchange goes over 127.0.0.1.
#
# Interface, all through the environment:
#   UFAB_BIN       the ufab binary (required)
#   RXE_GID_INDEX  rxe0's GID index of ::ffff:10.0.0.1, type RoCE v2
#                  (required): perftest's -x
#   KERN_IF        the kernel interface under rxe0, 10.0.0.1/24 (required):
#                  where the loss is made (lossy() in rxe_guest_lib.sh)
#   W              a directory for the runs' output (default: a new
#                  temporary one, removed at the end)
#   UFAB_VM_NIC1_BDF  ufab's NIC (default 0000:00:02.0), on vfio-pci;
#                  ufab is 10.0.0.2 on it
#   UFAB_PERFTEST_CASES  cases to run instead of the default list below:
#                  the same format, one case per line or ';' between cases
#   UFAB_PERFTEST_LIMIT  seconds for one side of one run (default 150)
#   UFAB_PERFTEST_FLUSH=0  leave out the two runs at the end that check
#                  `ufab perf --flush` refuses a perftest peer
#   UFAB_PERFTEST_VERBOSE=1  show both sides' output after passing runs
#                  too (always shown after a failing one)
#   UFAB_PERFTEST_KEEP=1  keep each run's output in W for a report
#                  (scripts/demo-guest.sh makes its table from them): run
#                  N's ufab stdout (its JSON) in run-N.ufab, perftest's
#                  stdout in run-N.perftest, and a line "N PASS|FAIL ROLE
#                  TEST SECONDS OPTIONS..." (tab-separated, the options
#                  space-separated) in runs.tsv; set W too
# It expects what rxe_interop_guest.sh's setup leaves behind: NIC 1 bound to
# vfio-pci, rxe0 on KERN_IF, 10.0.0.1/24, up. Needs perftest and jq (both
# in scripts/setup.sh). Prints "PASS ..." or "FAIL ..." per run and ends with
# "rxe_perftest_guest: N passed, M failed"; exit status 0 when all passed.
#
# One case, or a few, from the host (the rest of the suite cut short):
#   UFAB_INTEROP_CASES=none UFAB_INTEROP_LOSS=0 \
#     UFAB_PERFTEST_CASES='client - write-bw -s 65536 -n 200' tests/vm/suites/rxe_interop.sh
# or in `tests/vm/run-vm --interactive --smp 2 --nic e1000e --nic e1000e`:
# run rxe_interop_guest.sh once (UFAB_BIN=... UFAB_PERFTEST=0 ...), note
# the GID index its first PASS line names, then
#   UFAB_BIN=... RXE_GID_INDEX=1 KERN_IF=eth1 UFAB_PERFTEST_CASES=... tests/vm/rxe_perftest_guest.sh
#
# A case is one line: ROLE LOSS TEST [OPTION...]
#   ROLE    ufab's role: server (perftest is the client), client, or both
#           (two runs, ufab server first)
#   LOSS    -: none; loss: 2% of the packets that carry the test's data
#           (data_loss_mode below); or one lossy() mode by name: ingress,
#           ingress-all, egress
#   TEST    ufab perf's name: write-lat write-bw read-lat read-bw send-lat
#           send-bw atomic-lat atomic-bw; perftest's tool is ib_write_lat ...
#   OPTION  given as they are to both tools, in perftest's spelling; the
#           checks read -s, -n, -q, -a and -D (short forms only)
# Every run gets its own TCP port (-p 18600 and up: no TIME_WAIT from the
# run before), ufab `--ip 10.0.0.2 --timeout 30 --json`, perftest `-d rxe0
# -x RXE_GID_INDEX -F`. No -m: the path MTU is the smaller of both sides'
# (rxe's is 1024 on a 1500-byte netdev).
# -R among a case's options is perftest's rdma_cm mode, given to both
# tools: no TCP at all; the exchange goes over an rdma_cm connection and
# the test QPs are connected by rdma_cm (the kernel's on rxe0, ufab's
# connection manager on NIC 1), on the run's port. Each client then names
# the other side's RoCE address (10.0.0.1 / 10.0.0.2, not 127.0.0.1); the
# ufab server is awaited by its "waiting for a client on rdma_cm port"
# line, the perftest server by its listening rdma_cm id (`rdma resource
# show cm_id`); rdma_ucm is loaded for the first such case.
#
# Time under TCG: the 35 runs below took 231 s in one run on the 2-core
# build machine (QEMU 10, Linux 6.12 guest, 2 vCPUs; 2 to 12 s a run,
# write-lat -a 27 s, lossy read-bw with the ufab client 30 s). The script
# prints each run's seconds and the total. write-lat -a goes to 8 MiB (the
# 2, 4 and 8 MiB sizes dominate): the default has -n 5 (perftest's least,
# 160 MiB on the wire); -n 20 would take about 4 times as long:
# UFAB_PERFTEST_CASES='client - write-lat -a -n 20' runs it.
default_cases='
# ROLE  LOSS  TEST        OPTIONS
both    -     write-lat   -s 1 -n 100
both    -     write-lat   -s 2 -n 200
both    -     write-lat   -s 65536 -n 50
both    -     send-lat    -s 2 -n 200
both    -     send-lat    -s 4096 -n 100
both    -     read-lat    -s 2 -n 200
both    -     read-lat    -s 65536 -n 50
both    -     atomic-lat  -n 200
both    -     atomic-lat  -A CMP_AND_SWAP -n 100
both    -     write-bw    -s 65536 -n 200
both    -     write-bw    -s 1048576 -n 20
both    -     read-bw     -s 65536 -n 200
both    -     read-bw     -s 1048576 -n 10
both    -     send-bw     -s 4096 -n 500
both    -     atomic-bw   -n 500
both    -     write-bw    -q 2 -s 4096 -n 200
client  -     write-lat   -a -n 5
both    loss  write-bw    -s 65536 -n 100
both    loss  read-bw     -s 65536 -n 30
both    loss  send-lat    -s 4096 -n 100
both    -     write-bw    -R -s 65536 -n 200
both    -     send-lat    -R -s 2 -n 200
both    -     read-bw     -R -s 65536 -n 200
'
set -uo pipefail
ufab=${UFAB_BIN:?set UFAB_BIN to the ufab binary}
gid_index=${RXE_GID_INDEX:?set RXE_GID_INDEX to rxe0s GID index of ::ffff:10.0.0.1 (RoCE v2)}
ifname=${KERN_IF:?set KERN_IF to the kernel interface under rxe0}
ufab_bdf=${UFAB_VM_NIC1_BDF:-0000:00:02.0}
limit=${UFAB_PERFTEST_LIMIT:-150}  # seconds for one side of one run; each ufab wait is --timeout 30 within it
verbose=${UFAB_PERFTEST_VERBOSE:-0}
keep=${UFAB_PERFTEST_KEEP:-0}
here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
prog=rxe_perftest_guest
passed=0 failed=0
# say, pass, fail, finish, show, wait_line, wait_listen, rxe_diag,
# forget_neighbour, pin_neighbour, lossy, ...
# shellcheck source=tests/vm/rxe_guest_lib.sh
. "$here/rxe_guest_lib.sh"

if [ -z "${W:-}" ]; then
  W=$(mktemp -d)
  trap 'rm -rf "$W"' EXIT
fi
mkdir -p "$W" || { fail "cannot make the work directory $W"; finish; }
[[ $gid_index =~ ^[0-9]+$ ]] || { fail "RXE_GID_INDEX '$gid_index' is not a number"; finish; }
command -v ib_write_bw >/dev/null || { fail "perftest missing (apt-get install perftest; scripts/setup.sh does)"; finish; }
command -v jq >/dev/null || { fail "jq missing (apt-get install jq; scripts/setup.sh does)"; finish; }
if grep -q "unknown command 'perf'" <<<"$("$ufab" perf 2>&1)"; then
  fail "$ufab has no perf command (bazel build //tools/ufab)"; finish
fi

# ------------------------------------------------------------ expectations
# The result lines (size and iterations, as "size iters") that perftest
# prints for TEST in ROLE with OPTIONs, and `ufab perf` reports in its
# JSON's "results"; with -D only the sizes.
#   lat tests: one line per size, iters = -n. The read-lat and atomic-lat
#     server prints none (only the client works).
#   bw tests: iters = -n x -q (perftest counts every QP's). The write-bw,
#     read-bw and atomic-bw server prints the client's report; after -a,
#     only the last one (8 MiB).
#   atomic: always 8 bytes, one size.
expect() { # TEST ROLE OPTION...
  local test=$1 role=$2 size='' iters='' qps=1 all=0 dur=0 s
  shift 2
  while [ $# -gt 0 ]; do
    case $1 in
      -s) size=${2:-}; shift ;;
      -s?*) size=${1#-s} ;;
      -n) iters=${2:-}; shift ;;
      -n?*) iters=${1#-n} ;;
      -q) qps=${2:-}; shift ;;
      -q?*) qps=${1#-q} ;;
      -a) all=1 ;;
      -D) dur=1; shift ;;
      -D?*) dur=1 ;;
    esac
    shift
  done
  case $size in  # perftest's -s takes K and M (2^10, 2^20)
    *K) size=$((${size%K} * 1024)) ;;
    *M) size=$((${size%M} * 1048576)) ;;
  esac
  case $test in
    atomic-*) size=8 all=0 ;;
    *-lat) size=${size:-2} ;;
    *) size=${size:-65536} ;;
  esac
  [ "$test" = write-bw ] && iters=${iters:-5000}
  iters=${iters:-1000}
  case $test in *-bw) iters=$((iters * qps)) ;; esac
  case $test:$role in read-lat:server | atomic-lat:server) return ;; esac
  local sizes=$size
  if [ "$all" = 1 ]; then
    case $test:$role in
      write-bw:server | read-bw:server) sizes=8388608 ;;
      *) sizes=$(for ((s = 2; s <= 8388608; s *= 2)); do echo "$s"; done) ;;
    esac
  fi
  for s in $sizes; do
    if [ "$dur" = 1 ]; then echo "$s"; else echo "$s $iters"; fi
  done
}

# perftest's result lines: between its "#bytes ..." header and the next
# line of dashes, those that start with two numbers.
perftest_results() { # FILE
  awk '/#bytes/ { t = 1; next } t && /^-+$/ { t = 0 } t && $1 ~ /^[0-9]+$/ && $2 ~ /^[0-9]+$/' "$1"
}
listed() { if [ -n "$1" ]; then tr '\n' ';' <<<"$1" | sed 's/;$//; s/;/; /g'; else echo none; fi; }

# The packets that carry a test's data, as a lossy() mode: ufab's (ingress:
# rxe0's netdev drops them as it receives them; ufab's ACKs are spared) or
# rxe's (egress). write-bw and send-bw carry their data from the client to
# the server; read-* and atomic-* in the responses, from the server to the
# client; the latency ping-pongs both ways, and there the loss goes towards
# the client, as in rxe_interop_guest.sh (the client's ACK of the server's
# last message is the one packet nobody sends again). Nothing drops the
# ACK packets that rxe gets as a requester (rxe_guest_lib.sh says why);
# read-bw with the ufab server does drop ufab's READ responses to rxe
# (rxe's read retry: it asks again from the first missing PSN).
data_loss_mode() { # TEST ROLE
  case $1:$2 in
    write-bw:client | send-bw:client) echo ingress ;;
    write-bw:server | send-bw:server) echo egress ;;
    *:server) echo ingress ;;
    *:client) echo egress ;;
  esac
}
loss_label() { # MODE
  case $1 in
    egress) echo "rxe->ufab ($1)" ;;
    *) echo "ufab->rxe ($1)" ;;
  esac
}

# reap PID GRACE: waits up to GRACE seconds for PID (a `timeout` around a
# side) to end and stops it if it has not; its exit status in $reaped.
# Returns 1 when it had to be stopped.
reap() {
  local end=$((SECONDS + $2)) stopped=0
  while kill -0 "$1" 2>/dev/null && [ "$SECONDS" -lt "$end" ]; do sleep 0.1; done
  if kill -0 "$1" 2>/dev/null; then
    kill "$1" 2>/dev/null  # timeout passes SIGTERM on, and SIGKILL 5 s later (-k 5)
    stopped=1
  fi
  wait "$1"
  reaped=$?
  return "$stopped"
}
exit_why() { # WHO STATUS
  case $2 in
    124) echo "$1 ran into the $limit s limit" ;;
    *) echo "$1 exited with $2" ;;
  esac
}

# wait_cm_listen PID SECONDS PORT: until an rdma_cm id listens on PORT
# (`rdma resource show cm_id`: state LISTEN, src-addr ...:PORT), or PID is
# gone, or SECONDS have passed.
wait_cm_listen() {
  local end=$((SECONDS + $2))
  while :; do
    rdma resource show cm_id 2>/dev/null | grep 'state LISTEN' | grep -q "src-addr [^ ]*:$3\b" && return 0
    kill -0 "$1" 2>/dev/null && [ "$SECONDS" -lt "$end" ] || return 1
    sleep 0.1
  done
}

# ------------------------------------------------------------------- a run
port=18599
loss_loaded=0
ucm_loaded=0
# run ROLE MODE TEST OPTION...: one run, ufab in ROLE, loss MODE (a lossy()
# mode, or off); prints PASS or FAIL.
runs=0
run() {
  runs=$((runs + 1))
  local role=$1 mode=$2 test=$3
  shift 3
  local tool=ib_${test//-/_} kind=${test##*-} peer_role=server name upid rpid urc='' rrc='' dropped=''
  local why=() u r t0=$SECONDS
  [ "$role" = server ] && peer_role=client
  port=$((port + 1))
  name="perftest $test${*:+ $*}: ufab $role, $tool $peer_role"
  [ "$mode" = off ] || name="$name, 2% loss $(loss_label "$mode")"
  rm -f "$W"/u.* "$W"/r.* "$W"/tc
  local cm=0 a ufab_server=127.0.0.1 rxe_server=127.0.0.1
  for a in "$@"; do case $a in -R | --rdma_cm) cm=1 ;; esac; done
  if [ "$cm" = 1 ]; then
    ufab_server=10.0.0.1 rxe_server=10.0.0.2
    if [ "$ucm_loaded" = 0 ]; then
      # /dev/infiniband/rdma_cm (rdma_ucm): nothing loads it on demand here.
      if ! timeout 60 modprobe rdma_ucm || [ ! -c /dev/infiniband/rdma_cm ]; then
        fail "$name: modprobe rdma_ucm (perftest -R needs /dev/infiniband/rdma_cm)"
        return
      fi
      ucm_loaded=1
    fi
  fi
  u=("$ufab" perf "$test" "$ufab_bdf" --ip 10.0.0.2)
  r=(stdbuf -oL "$tool" -d rxe0 -x "$gid_index" -F -p "$port" "$@")  # stdbuf: its output survives a kill
  [ "$role" = client ] && u+=("$ufab_server")
  [ "$peer_role" = client ] && r+=("$rxe_server")
  u+=(-p "$port" --timeout 30 --json "$@")

  if [ "$mode" != off ]; then
    [ "$loss_loaded" = 1 ] || { lossy_modules; loss_loaded=1; }
    if ! { [ "$mode" != egress ] || pin_neighbour; } || ! lossy "$mode"; then
      fail "$name: could not set up 2% $mode loss on $ifname (sch_netem, sch_ingress, cls_u32, cls_matchall, act_gact)"
      lossy off
      unpin_neighbour
      return
    fi
  fi
  forget_neighbour

  if [ "$role" = server ]; then
    # perftest's client does not retry its connect: start it once ufab listens.
    timeout -k 5 "$limit" "${u[@]}" >"$W/u.out" 2>"$W/u.err" &
    upid=$!
    local ready="waiting for a client on TCP port $port\$"
    [ "$cm" = 0 ] || ready="waiting for a client on rdma_cm port $port (10.0.0.2)\$"
    if wait_line "$W/u.err" "$ready" "$upid" 60; then
      timeout -k 5 "$limit" "${r[@]}" >"$W/r.out" 2>"$W/r.err"
      rrc=$?
      reap "$upid" 45 || why+=("ufab did not end within 45 s of $tool's exit")
    else
      reap "$upid" 0 || why+=("ufab did not say '${ready%\$}' within 60 s")
      : >"$W/r.out"
    fi
    urc=$reaped
  else
    # ufab's client retries while refused; the wait only saves it the retries.
    timeout -k 5 "$limit" "${r[@]}" >"$W/r.out" 2>"$W/r.err" &
    rpid=$!
    if [ "$cm" = 1 ]; then
      wait_cm_listen "$rpid" 30 "$port" || say "$tool has no rdma_cm id listening on port $port after 30 s (ufab's client retries while rejected)"
    else
      wait_listen "$rpid" 30 "$port" || say "$tool is not listening on TCP port $port after 30 s (ufab's client retries while refused)"
    fi
    timeout -k 5 "$limit" "${u[@]}" >"$W/u.out" 2>"$W/u.err"
    urc=$?
    local grace=45
    [ "$urc" -eq 0 ] || grace=5  # the run has failed: only collect perftest's output
    reap "$rpid" "$grace" || why+=("$tool did not end within $grace s of ufab's exit")
    rrc=$reaped
  fi

  if [ "$mode" != off ]; then
    lossy_stats "$mode" >"$W/tc" 2>&1
    lossy off
    unpin_neighbour
    if grep -q 'dropped [0-9]' "$W/tc"; then
      dropped=$(grep -o 'dropped [0-9]*' "$W/tc" | awk '{ n += $2 } END { print n + 0 }')
    else
      dropped='?'  # tc's statistics not as expected: not checked
    fi
  fi

  # ---- checks
  [ "$urc" -eq 0 ] || why+=("$(exit_why ufab "$urc")")
  if [ -z "$rrc" ]; then
    why+=("$tool not started")
  elif [ "$rrc" -ne 0 ]; then
    why+=("$(exit_why "$tool" "$rrc")")
  fi

  # perftest's result lines: the sizes and iterations asked for.
  local want got fields=2 dur=0 a
  for a in "$@"; do case $a in -D*) dur=1 fields=1 ;; esac; done
  want=$(expect "$test" "$peer_role" "$@")
  got=$(perftest_results "$W/r.out" | awk -v f=$fields '{ print (f == 1 ? $1 : $1 " " $2) }')
  if [ -n "$rrc" ] && [ "$got" != "$want" ]; then
    if [ -z "$got" ]; then
      why+=("$tool printed no result line (expected, size iters: $(listed "$want"))")
    else
      why+=("$tool reported (size iters) $(listed "$got"), not $(listed "$want")")
    fi
  fi

  # ufab's JSON: one object, ok, this test and role, the same results,
  # and every frame rxe sent passed ufab's parser (IPv4, UDP, BTH, ICRC).
  local j_ok='' j_test='' j_role='' j_parse='' j_retx='' j_tmo='' j_spn='' j_msg='' ugot
  if ! jq -s -e 'length == 1 and (.[0] | type == "object")' "$W/u.out" >/dev/null 2>&1; then
    why+=("ufab's stdout is not one JSON object")
  else
    # (Here-strings, not <(...): the guest has no /dev/fd.)
    IFS=$'\t' read -r j_ok j_test j_role j_parse j_retx j_tmo j_spn j_msg <<<"$(jq -r '[(.ok | tostring), .test, .role,
      (.transport.rx_parse_errors // "none"), (.transport.retransmits // "-"), (.transport.timeouts // "-"),
      (.transport.sent_per_needed // "-"), (.message // "" | gsub("\t"; " "))] | map(tostring) | join("\t")' "$W/u.out")"
    if [ "$j_ok" != true ]; then
      why+=("ufab's JSON has ok: $j_ok${j_msg:+ ($j_msg)}")
    else
      [ "$j_test" = "$test" ] || why+=("ufab's JSON names test '$j_test'")
      [ "$j_role" = "$role" ] || why+=("ufab's JSON names role '$j_role'")
      want=$(expect "$test" "$role" "$@")
      ugot=$(jq -r --argjson f $fields '.results[]? | if $f == 1 then "\(.size)" else "\(.size) \(.iters)" end' "$W/u.out")
      [ "$ugot" = "$want" ] || why+=("ufab's JSON results (size iters) are $(listed "$ugot"), not $(listed "$want")")
      [ "$j_parse" = 0 ] || why+=("ufab's transport counted rx_parse_errors: $j_parse")
    fi
  fi
  [ "$dropped" != 0 ] || why+=("tc dropped nothing: the loss was not in effect")

  local secs=$((SECONDS - t0))
  if [ "${#why[@]}" -eq 0 ]; then
    # The last result line's figure from each side: t_typical (t_avg with
    # -D) or BW average.
    local col=4 key=bw_avg unit='BW average[MB/sec]' pf uf n
    case " $* " in *" --report_gbits "*) unit='BW average[Gb/sec]' ;; esac
    if [ "$kind" = lat ]; then
      col=5 key=t_typical_usec unit='t_typical[usec]'
      [ "$dur" = 0 ] || col=3 key=t_avg_usec unit='t_avg[usec]'
    fi
    pf=$(perftest_results "$W/r.out" | tail -n 1 | awk -v c=$col '{ print $c }')
    uf=$(jq -r --arg k "$key" '.results[-1][$k] // empty' "$W/u.out" 2>/dev/null)
    n=$(grep -c . <<<"$want")
    local figs="$unit ufab ${uf:--}, $tool ${pf:--}"
    [ "$n" -le 1 ] || figs="$n sizes, the last: $figs"
    # Data packets per packet needed, as ufab saw them (api/ufab/rdma.h
    # ufab_sent_per_needed: ufab's sends with resends, plus what rxe sent
    # that ufab received twice or ahead of a gap).
    local spn
    spn=$(printf '%.2f' "$j_spn" 2>/dev/null) || spn=-
    pass "$name: $figs; sent/needed $spn, ufab retransmits $j_retx, timeouts $j_tmo${dropped:+; tc dropped $dropped}; $secs s"
  else
    fail "$name: $(printf '%s; ' "${why[@]}")$secs s"
  fi
  if [ "${#why[@]}" -ne 0 ] || [ "$verbose" = 1 ]; then
    echo "--- ufab: ${u[*]}"
    show "$W/u.out" "ufab stdout"
    [ -s "$W/u.err" ] && show "$W/u.err" "ufab stderr"
    echo "--- $tool: ${r[*]}"
    show "$W/r.out" "$tool stdout"
    [ -s "$W/r.err" ] && show "$W/r.err" "$tool stderr"
    [ -s "$W/tc" ] && show "$W/tc" "tc -s ($mode)"
  fi
  [ "${#why[@]}" -eq 0 ] || rxe_diag
  if [ "$keep" = 1 ]; then
    cp "$W/u.out" "$W/run-$runs.ufab" 2>/dev/null
    cp "$W/r.out" "$W/run-$runs.perftest" 2>/dev/null
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$runs" "$([ "${#why[@]}" -eq 0 ] && echo PASS || echo FAIL)" \
      "$role" "$test" "$secs" "$*" >>"$W/runs.tsv"
  fi
}

# ------------------------------------------------------------------ the cases
mapfile -t lines <<<"$(tr ';' '\n' <<<"${UFAB_PERFTEST_CASES:-$default_cases}")"
ver=$(ib_write_bw --version 2>/dev/null | sed -n 's/^Version: //p' | head -n 1)
say "perftest ${ver:-(version unknown)}, rxe0 GID index $gid_index on $ifname, ufab on $ufab_bdf"
t_all=$SECONDS
for line in "${lines[@]}"; do
  line=${line%%#*}
  read -r -a f <<<"$line"
  [ "${#f[@]}" -gt 0 ] || continue
  roles=${f[0]} loss=${f[1]:-} test=${f[2]:-}
  case $roles in both) roles="server client" ;; server | client) ;; *) roles= ;; esac
  case $test in write-lat | write-bw | read-lat | read-bw | send-lat | send-bw | atomic-lat | atomic-bw) ;; *) test= ;; esac
  case $loss in - | loss | ingress | ingress-all | egress) ;; *) loss= ;; esac
  if [ -z "$roles" ] || [ -z "$test" ] || [ -z "$loss" ]; then
    fail "case '$line': expected ROLE (server, client, both) LOSS (-, loss, ingress, ingress-all, egress) TEST [OPTION...]"
    continue
  fi
  for role in $roles; do
    case $loss in
      -) mode=off ;;
      loss) mode=$(data_loss_mode "$test" "$role") ;;
      *) mode=$loss ;;
    esac
    run "$role" "$mode" "$test" "${f[@]:3}"
  done
done
say "$runs runs took $((SECONDS - t_all)) s"

# ------------------------------------------------- FLUSH against perftest
# perftest has no FLUSH: `ufab perf --flush` facing it (ufab's mark is not
# in perftest's version block) must stop after the version exchange, in
# either role, saying so, well inside its --timeout; perftest's side is
# only collected (it sees its peer hang up). UFAB_PERFTEST_FLUSH=0 leaves
# these out.
flush_refused() { # ROLE TEST
  local role=$1 test=$2 tool=ib_${2//-/_} u r upid rpid urc t0 why=()
  port=$((port + 1))
  rm -f "$W"/u.* "$W"/r.*
  u=("$ufab" perf "$test" "$ufab_bdf" --ip 10.0.0.2 -p "$port" --timeout 30 --flush global -n 20)
  r=(stdbuf -oL "$tool" -d rxe0 -x "$gid_index" -F -p "$port" -n 20)
  t0=$SECONDS
  if [ "$role" = server ]; then
    timeout -k 5 60 "${u[@]}" >"$W/u.out" 2>"$W/u.err" &
    upid=$!
    if wait_line "$W/u.err" "waiting for a client on TCP port $port\$" "$upid" 60; then
      timeout -k 5 60 "${r[@]}" 127.0.0.1 >"$W/r.out" 2>"$W/r.err"
    fi
    reap "$upid" 20 || why+=("ufab did not end within 20 s of $tool's exit")
    urc=$reaped
  else
    timeout -k 5 60 "${r[@]}" >"$W/r.out" 2>"$W/r.err" &
    rpid=$!
    wait_listen "$rpid" 30 "$port" || say "$tool is not listening on TCP port $port after 30 s"
    timeout -k 5 60 "${u[@]}" 127.0.0.1 >"$W/u.out" 2>"$W/u.err"
    urc=$?
    reap "$rpid" 20 || why+=("$tool did not end within 20 s of ufab's exit")
  fi
  [ "$urc" -eq 1 ] || why+=("ufab exited $urc, expected 1")
  grep -q "the peer is not \`ufab perf\` (it announced perftest .* without ufab's mark): perftest's tools .* have no FLUSH" "$W/u.err" ||
    why+=("ufab did not say that perftest has no FLUSH")
  [ $((SECONDS - t0)) -lt 30 ] || why+=("it took $((SECONDS - t0)) s, more than ufab's 30 s --timeout: something waited it out")
  local name="$test --flush global: ufab $role against $tool: refused after the version exchange"
  if [ ${#why[@]} -eq 0 ]; then
    pass "$name ($((SECONDS - t0)) s)"
  else
    fail "$name: ${why[*]}"
    show "$W/u.err" "ufab stderr"
    show "$W/r.out" "$tool stdout"
    show "$W/r.err" "$tool stderr"
  fi
}
if [ "${UFAB_PERFTEST_FLUSH:-1}" != 0 ]; then
  flush_refused client write-bw
  flush_refused server write-lat
fi
[ "$runs" -gt 0 ] || [ "$failed" -gt 0 ] || fail "no run: UFAB_PERFTEST_CASES has no case"
finish
