#!/usr/bin/env bash
# Runs in the VM (tests/vm/suites/rdma_cm.sh boots it with two e1000e NICs
# on the hub): ufab's connection manager against the kernel's rdma_cm, with
# rdmacm-utils' rping and ucmatose on Linux soft-RoCE. NIC 1 (00:02.0) is
# bound to vfio-pci and driven by `ufab rping` as 10.0.0.2; NIC 2 (00:03.0)
# stays with the kernel, carries 10.0.0.1/24 and rxe0. Nothing but the CM
# connects the two sides: no TCP exchange, unlike rxe_interop.
#
# The cases (UFAB_CM_CASES picks them, in this order):
#   kernel    rping server and client on rxe0 over rxe's loopback (no
#             frame leaves the guest): -S 64 and 65535, -v -V; a kernel
#             client to a port where nothing listens is REJected
#             (RDMA_CM_EVENT_REJECTED, error 8: invalid service id);
#             ucmatose server and client the same way. Proves the tools,
#             rdma_ucm and rxe work here before ufab is involved.
#   client    `ufab rping -c` against kernel `rping -s -v`, -C COUNT, at
#             every size of UFAB_CM_SIZES
#   server    kernel `rping -c -v -V` against `ufab rping -s`, the same
#   jumbo     kernel `rping -c -v -V` against `ufab rping -s --param
#             mtu=9000` at -S 65535: ufab's e1000e takes jumbo frames and its
#             active MTU is 4096, the kernel's rxe0 sits on a 1500-MTU
#             netdev (1024); the REQ offers 1024 and ufab takes the smaller,
#             so both QPs use 1024 (a mismatch would fail: FIRST/MIDDLE
#             packets must carry exactly the path MTU, and the server READs
#             64 packets and WRITEs them back)
#   reject    `ufab rping -c` to a port where nothing listens on rxe0 gets
#             the kernel's REJ: exits non-zero, says "rejected"; and a
#             kernel `rping -c` to a port `ufab rping -s` does not listen on
#             gets ufab's REJ (error 8), after which the same ufab server
#             still serves a kernel client on its own port; the same with
#             `ufab cmatose` and ucmatose where ufab has cmatose
#   ucmatose  the kernel's ucmatose against `ufab cmatose` (ucmatose's
#             protocol over ufab's CM) in both roles, -C 10; only if this
#             ufab has that command (otherwise one SKIP line says so)
#   loss      2% loss on everything rxe0's netdev sends (netem), ufab's MAC
#             pinned (the kernel's ARP would be lost too); rping -C
#             UFAB_CM_LOSS_COUNT at -S UFAB_CM_LOSS_SIZE in both roles, and
#             ucmatose/ufab cmatose -C UFAB_CM_LOSS_COUNT both ways: CM
#             MADs and RC packets the kernel sends are lost and must be
#             sent again (ib_cm's retries, ufab's duplicate handling, RC
#             retransmission)
#
# What a passing rping case shows: both sides exit 0 within the limit; the
# client's -v lines are exactly the COUNT lines rping prints ("ping data:
# rdma-ping-N: " and rping's cycling A..z fill, SIZE-1 characters; rping's
# RPING_MSG_FMT), i.e. what the server RDMA WRITEs back is what it RDMA
# READ from the client, byte for byte (and the client's -V compared its
# whole buffer); and the server's -v lines ("server ping data: ...") are
# the same text, what it READ. The kernel side's lines are part of the
# case's check; ufab's lines (the same text, printed as rping prints it)
# are checked in a PASS/FAIL of their own.
#
# rping (rdmacm-utils 44) takes -S from 23 to 65535: "-S 65536" is refused
# ("Invalid size 65536 (valid range is 23 to 65536)", the message notwith-
# standing), so the large size is 65535 (64 packets at MTU 1024).
#
# Prints "PASS ..."/"FAIL ..."/"SKIP ..." per check, both sides' output
# (long lines cut), and ends with "rdma_cm_guest: N passed, M failed"; exit
# status 0 when all passed. Also prints "CM_WIRE_CASES <cases>": the cases
# that put CM MADs on the hub (the host's wire checks expect them).
#
# Environment: UFAB_BIN (the ufab binary, required), UFAB_CM_CASES (default
# "kernel client server jumbo reject ucmatose loss"), UFAB_CM_COUNT (default 10),
# UFAB_CM_SIZES (default "64 65535"), UFAB_CM_LOSS_COUNT (default 50),
# UFAB_CM_LOSS_SIZE (default 4096).
set -uo pipefail
ufab=${UFAB_BIN:?set UFAB_BIN to the ufab binary}
ufab_bdf=${UFAB_VM_NIC1_BDF:-0000:00:02.0}
kern_bdf=${UFAB_VM_NIC2_BDF:-0000:00:03.0}
cases=${UFAB_CM_CASES:-kernel client server jumbo reject ucmatose loss}
count=${UFAB_CM_COUNT:-10}
sizes=${UFAB_CM_SIZES:-64 65535}
loss_count=${UFAB_CM_LOSS_COUNT:-50}
loss_size=${UFAB_CM_LOSS_SIZE:-4096}
kern_ip=10.0.0.1
ufab_ip=10.0.0.2
limit=120  # seconds for one side of one case (the loss cases: 300)

here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
w=$(mktemp -d)
passed=0 failed=0 skipped=0
prog=rdma_cm_guest
wire_cases=()
# say, pass, fail, finish, show, wait_line, rxe_setup, rxe_diag,
# pin_neighbour, lossy, ...
# shellcheck source=tests/vm/rxe_guest_lib.sh
. "$here/rxe_guest_lib.sh"
skip() { skipped=$((skipped + 1)); echo "SKIP $*"; }

# ------------------------------------------------------------------ helpers
# Every case gets its own rdma_cm port: 7200, 7201, ...
next_port=7200
port() { port_=$next_port; next_port=$((next_port + 1)); }

# show_cut FILE LABEL: as show, at most 40 lines of at most 160 characters
# (rping -v prints each SIZE-byte buffer as one line).
show_cut() {
  echo "--- $2"
  [ -s "$1" ] || { echo "  | (empty)"; return; }
  head -n 40 "$1" | cut -c1-160 | sed 's/^/  | /'
  local n
  n=$(wc -l <"$1")
  [ "$n" -le 40 ] || echo "  | ... ($n lines)"
}

# rping_lines PREFIX COUNT SIZE: the COUNT lines rping -v prints, each
# PREFIX then the buffer as a string: "rdma-ping-N: " and, from character
# 65 + N mod 58 on, 'A'..'z' cycling, SIZE-1 characters in all (the last
# byte of the buffer is its NUL). rdma-core librdmacm/examples/rping.c
# (rping_test_client) fills the buffer so.
rping_lines() {
  awk -v pfx="$1" -v n="$2" -v size="$3" 'BEGIN {
    cyc = ""; for (c = 65; c <= 122; c++) cyc = cyc sprintf("%c", c)
    big = cyc; while (length(big) < size + 2 * 58) big = big big
    for (i = 0; i < n; i++) {
      head = sprintf("rdma-ping-%d: ", i)
      print pfx head substr(big, (i % 58) + 1, size - 1 - length(head))
    }
  }'
}

# lines_ok FILE PREFIX COUNT SIZE: FILE's lines that start with PREFIX are
# exactly rping_lines PREFIX COUNT SIZE. Sets lines_why when not.
lines_ok() {
  local got=$w/lines.got want=$w/lines.want n
  grep -a "^$2" "$1" >"$got" 2>/dev/null
  rping_lines "$2" "$3" "$4" >"$want"
  cmp -s "$got" "$want" && return 0
  n=$(wc -l <"$got")
  if [ "$n" -ne "$3" ]; then
    lines_why="$n '$2' lines, want $3"
  else
    n=$(diff <(cut -c1-40 "$got") <(cut -c1-40 "$want") | grep -c '^<')
    lines_why="'$2' lines differ from rping's text (first difference at line $(cmp "$got" "$want" 2>/dev/null | sed -n 's/.* line \([0-9]*\).*/\1/p'); $n of $3 differ in their first 40 characters)"
  fi
  return 1
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

# wait_ufab_listen PID SECONDS: until the ufab server (s.out, s.err) says
# it listens ("listen" or "waiting"), or as wait_line.
wait_ufab_listen() {
  local end=$((SECONDS + $2))
  while :; do
    cat "$w/s.out" "$w/s.err" 2>/dev/null | grep -qi 'listen\|waiting' && return 0
    kill -0 "$1" 2>/dev/null && [ "$SECONDS" -lt "$end" ] || return 1
    sleep 0.1
  done
}

# has_ufab_cmd NAME: `ufab --help` lists the command NAME.
has_ufab_cmd() { "$ufab" --help 2>&1 | grep -Eq "^  $1( |$)"; }

# ufab's side: the rping command on the vfio NIC (DEVICE and --ip as
# `ufab pingpong` and `ufab perf` take them); rping's options follow.
ufab_rping=("$ufab" rping "$ufab_bdf" --ip "$ufab_ip")

# wait_bounded PID: waits for PID, the side that runs on in the
# background, at most $grace seconds after the other side ended (a server
# whose client failed would otherwise wait for its own `timeout`); then
# stops it and returns 200.
grace=30
wait_bounded() {
  local end=$((SECONDS + grace))
  while kill -0 "$1" 2>/dev/null && [ "$SECONDS" -lt "$end" ]; do sleep 0.2; done
  if kill -0 "$1" 2>/dev/null; then
    kill "$1" 2>/dev/null  # timeout passes the TERM on to its command
    sleep 2
    kill -0 "$1" 2>/dev/null && kill -9 "$1" 2>/dev/null
    wait "$1"
    return 200
  fi
  wait "$1"
}

rc_text() { # RC: "0", or "N" with what N means when timeout or wait_bounded gave it
  case $1 in
    124) echo "124 (killed by timeout after $limit s)" ;;
    200) echo "none (still running $grace s after the other side ended: stopped)" ;;
    *) echo "$1" ;;
  esac
}

# check_rping NAME SIZE COUNT CLIENT SERVER: after crc/src are set and
# c.out/c.err (client) and s.out/s.err (server) written. CLIENT and SERVER
# name the sides ("kernel rping", "ufab rping"). One PASS/FAIL for the
# exchange: both exited 0, no data mismatch, and the kernel side's -v lines
# are rping's text. Where ufab is a side, one more for ufab's -v lines
# (the same text, as rping prints it), so that a difference in what ufab
# prints is told apart from a failed exchange.
check_rping() {
  local name=$1 size=$2 n=$3 cname=$4 sname=$5 ok=1 why=() uwhy=() side
  [ "$crc" -eq 0 ] || { ok=0; why+=("$cname -c: exit $(rc_text "$crc")"); }
  [ "$src" -eq 0 ] || { ok=0; why+=("$sname -s: exit $(rc_text "$src")"); }
  if grep -q 'data mismatch' "$w/c.err" "$w/c.out" 2>/dev/null; then
    ok=0; why+=("$cname -c -V: data mismatch")
  fi
  for side in c s; do
    local who pfx
    if [ "$side" = c ]; then who="$cname -c" pfx='ping data: '; else who="$sname -s" pfx='server ping data: '; fi
    lines_ok "$w/$side.out" "$pfx" "$n" "$size" && continue
    case $who in
      kernel*) ok=0; why+=("$who: $lines_why") ;;
      *) uwhy+=("$who: $lines_why") ;;
    esac
  done
  if [ "$ok" -eq 1 ]; then
    pass "$name: $n pings of $size bytes, validated; the kernel's -v text is rping's"
  else
    local IFS=';'
    fail "$name: ${why[*]}"
  fi
  if [[ "$cname $sname" == *ufab* ]]; then
    if [ "${#uwhy[@]}" -eq 0 ]; then
      pass "$name: ufab's -v lines are rping's ($n, '$([ "$cname" = "ufab rping" ] && echo 'ping data: ' || echo 'server ping data: ')...')"
    else
      local IFS=';'
      fail "$name: ufab's -v lines: ${uwhy[*]}"
    fi
  fi
  show_cut "$w/c.out" "$cname -c stdout"
  [ -s "$w/c.err" ] && show_cut "$w/c.err" "$cname -c stderr"
  show_cut "$w/s.out" "$sname -s stdout"
  [ -s "$w/s.err" ] && show_cut "$w/s.err" "$sname -s stderr"
  [ "$ok" -eq 1 ] || rxe_diag
}

# The sides of a case. Each runs under `timeout`, its output in $w; the
# kernel's tools under `stdbuf -oL`, so that what they printed is there
# even when they are stopped.
kernel_server_bg() { # PORT SIZE: rping -s on rxe0's address, in the background (spid)
  timeout "$limit" stdbuf -oL rping -s -a "$kern_ip" -p "$1" -S "$2" -v >"$w/s.out" 2>"$w/s.err" &
  spid=$!
}
kernel_client() { # ADDR PORT SIZE COUNT
  timeout "$limit" stdbuf -oL rping -c -a "$1" -p "$2" -S "$3" -C "$4" -v -V >"$w/c.out" 2>"$w/c.err"
}

# rping_kernel_loopback SIZE: both sides the kernel's, over rxe0's loopback.
rping_kernel_loopback() {
  local size=$1 name
  port
  name="kernel rping -s / kernel rping -c over rxe loopback, -S $size -C $count (port $port_)"
  rm -f "$w"/[cs].*
  kernel_server_bg "$port_" "$size"
  if ! wait_cm_listen "$spid" 30 "$port_"; then
    say "no rdma_cm listener on port $port_ after 30 s; trying the client anyway"
  fi
  kernel_client "$kern_ip" "$port_" "$size" "$count"; crc=$?
  wait_bounded "$spid"; src=$?
  check_rping "$name" "$size" "$count" "kernel rping" "kernel rping"
}

# rping_ufab_client SIZE COUNT [LABEL]: kernel rping -s, ufab rping -c.
rping_ufab_client() {
  local size=$1 n=$2 name
  port
  name="${3:-}kernel rping -s, ufab rping -c, -S $size -C $n (port $port_)"
  rm -f "$w"/[cs].*
  kernel_server_bg "$port_" "$size"
  if ! wait_cm_listen "$spid" 30 "$port_"; then
    kill "$spid" 2>/dev/null; wait "$spid"
    fail "$name: the kernel's rping -s did not listen on port $port_ within 30 s"
    show_cut "$w/s.err" "kernel rping -s stderr"
    return
  fi
  timeout "$limit" "${ufab_rping[@]}" -c -a "$kern_ip" -p "$port_" -S "$size" -C "$n" -v -V \
    >"$w/c.out" 2>"$w/c.err"
  crc=$?
  wait_bounded "$spid"; src=$?
  check_rping "$name" "$size" "$n" "ufab rping" "kernel rping"
}

# ufab_server_bg PORT SIZE COUNT: ufab rping -s -v -V in the background
# (upid), its output in s.out/s.err; with -C COUNT it checks that the
# client made COUNT pings, with -V that what it READ is rping's payload.
# Returns 1 when it does not say it listens within 60 s.
ufab_server_bg() {
  timeout "$limit" "${ufab_rping[@]}" -s -a "$ufab_ip" -p "$1" -S "$2" -C "$3" -v -V \
    >"$w/s.out" 2>"$w/s.err" &
  upid=$!
  wait_ufab_listen "$upid" 60
}

# not_listening: after ufab_server_bg failed, stops the server and says
# why in nl_why (not in a subshell: it waits for its child).
not_listening() {
  local r
  if kill -0 "$upid" 2>/dev/null; then
    kill "$upid" 2>/dev/null; wait "$upid"
    nl_why="did not say it listens (\"listen\" or \"waiting\") within 60 s"
  else
    wait "$upid"; r=$?
    nl_why="exited with $(rc_text "$r") before it said it listens (\"listen\" or \"waiting\")"
  fi
}

# rping_ufab_server SIZE COUNT [LABEL]: ufab rping -s, kernel rping -c.
rping_ufab_server() {
  local size=$1 n=$2 name
  port
  name="${3:-}ufab rping -s -v -V, kernel rping -c -v -V, -S $size -C $n (port $port_)"
  rm -f "$w"/[cs].*
  if ! ufab_server_bg "$port_" "$size" "$n"; then
    not_listening
    fail "$name: ufab rping -s $nl_why"
    show_cut "$w/s.out" "ufab rping -s stdout"; show_cut "$w/s.err" "ufab rping -s stderr"
    return
  fi
  kernel_client "$ufab_ip" "$port_" "$size" "$n"; crc=$?
  wait_bounded "$upid"; src=$?
  check_rping "$name" "$size" "$n" "kernel rping" "ufab rping"
}

# ------------------------------------------------------------------ setup
timeout 60 modprobe vfio-pci || { fail "modprobe vfio-pci"; finish; }
timeout 60 "$ufab" bind "$ufab_bdf" >/dev/null || { fail "ufab bind $ufab_bdf"; finish; }
ifname=$(ls "/sys/bus/pci/devices/$kern_bdf/net" 2>/dev/null | head -n1)
[ -n "$ifname" ] || { fail "no kernel interface on $kern_bdf"; finish; }
rxe_setup "$ifname" "$kern_ip" || { fail "rxe0 on $ifname (rxe_setup, see above)"; finish; }
# rping and ucmatose talk to the kernel's rdma_cm through
# /dev/infiniband/rdma_cm (rdma_ucm); nothing loads it on demand here.
timeout 60 modprobe rdma_ucm || { fail "modprobe rdma_ucm"; finish; }
for _ in $(seq 50); do [ -c /dev/infiniband/rdma_cm ] && break; sleep 0.1; done
[ -c /dev/infiniband/rdma_cm ] || { fail "no /dev/infiniband/rdma_cm after modprobe rdma_ucm"; finish; }
for t in rping ucmatose; do
  command -v "$t" >/dev/null || { fail "$t missing (apt-get install rdmacm-utils; scripts/setup.sh does)"; finish; }
done
state=$(cat /sys/class/infiniband/rxe0/ports/1/state 2>/dev/null)
pass "rxe0 on $ifname ($state), GID index $rxe_gid_index = ::ffff:$kern_ip, rdma_ucm loaded; ufab on $ufab_bdf as $ufab_ip"

have_rping=0
if has_ufab_cmd rping; then
  have_rping=1
else
  say "this ufab ($ufab) has no rping command: every case that needs it fails"
fi

# ------------------------------------------------------------------ cases
case_kernel() {
  local s name
  for s in $sizes; do rping_kernel_loopback "$s"; done

  # A REJ from the kernel's own CM: nothing listens on the port.
  port
  name="kernel rping -c to port $port_, where nothing listens, over rxe loopback: REJ (invalid service id)"
  rm -f "$w"/c.*
  kernel_client "$kern_ip" "$port_" 64 1; crc=$?
  if [ "$crc" -ne 0 ] && [ "$crc" -ne 124 ] && grep -q 'RDMA_CM_EVENT_REJECTED, error 8' "$w/c.err"; then
    pass "$name: exit $crc, $(grep -m1 REJECTED "$w/c.err")"
  else
    fail "$name: exit $(rc_text "$crc"), want non-zero and \"RDMA_CM_EVENT_REJECTED, error 8\""
    show_cut "$w/c.out" "kernel rping -c stdout"; show_cut "$w/c.err" "kernel rping -c stderr"
  fi

  # ucmatose: a server (no -s) and a client (-s SERVER), 10 SENDs each way.
  port
  name="kernel ucmatose server / kernel ucmatose client over rxe loopback, -C 10 (port $port_)"
  rm -f "$w"/[cs].*
  timeout "$limit" stdbuf -oL ucmatose -b "$kern_ip" -p "$port_" -C 10 >"$w/s.out" 2>"$w/s.err" &
  spid=$!
  wait_cm_listen "$spid" 30 "$port_" || say "no rdma_cm listener on port $port_ after 30 s; trying the client anyway"
  timeout "$limit" stdbuf -oL ucmatose -s "$kern_ip" -p "$port_" -C 10 >"$w/c.out" 2>"$w/c.err"; crc=$?
  wait_bounded "$spid"; src=$?
  if [ "$crc" -eq 0 ] && [ "$src" -eq 0 ] && grep -q 'test complete' "$w/c.out" && grep -q 'test complete' "$w/s.out"; then
    pass "$name: both said \"test complete\""
  else
    fail "$name: client exit $(rc_text "$crc"), server exit $(rc_text "$src"), want 0 and \"test complete\" from both"
    rxe_diag
  fi
  show_cut "$w/c.out" "ucmatose client stdout"; [ -s "$w/c.err" ] && show_cut "$w/c.err" "ucmatose client stderr"
  show_cut "$w/s.out" "ucmatose server stdout"; [ -s "$w/s.err" ] && show_cut "$w/s.err" "ucmatose server stderr"
}

case_client() {
  local s
  [ "$have_rping" = 1 ] || { fail "kernel rping -s, ufab rping -c: no 'ufab rping' command in $ufab"; return; }
  wire_cases+=(client)
  for s in $sizes; do rping_ufab_client "$s" "$count"; done
}

case_server() {
  local s
  [ "$have_rping" = 1 ] || { fail "ufab rping -s, kernel rping -c: no 'ufab rping' command in $ufab"; return; }
  wire_cases+=(server)
  for s in $sizes; do rping_ufab_server "$s" "$count"; done
}

case_jumbo() {
  local saved=("${ufab_rping[@]}")
  [ "$have_rping" = 1 ] || { fail "jumbo: no 'ufab rping' command in $ufab"; return; }
  ufab_rping+=(--param mtu=9000)
  rping_ufab_server 65535 "$count" "ufab at mtu=9000 (active MTU 4096), kernel rxe0 at 1500 (1024): "
  ufab_rping=("${saved[@]}")
}

case_reject() {
  if [ "$have_rping" = 1 ] || [ "$have_cmatose" = 1 ]; then wire_cases+=(reject); fi
  if [ "$have_rping" = 1 ]; then reject_rping; else fail "REJ cases with rping: no 'ufab rping' command in $ufab"; fi
  if [ "$have_cmatose" = 1 ]; then reject_cmatose; else skip "REJ cases with ucmatose: this ufab has no cmatose command"; fi
}

# REJ both ways with ucmatose and `ufab cmatose`, as reject_rping does with rping.
reject_cmatose() {
  local name t0 el good bad
  port
  name="ufab cmatose -s $kern_ip -p $port_, where nothing listens: rejected"
  rm -f "$w"/c.*
  t0=$SECONDS
  timeout "$limit" "$ufab" cmatose "$ufab_bdf" --ip "$ufab_ip" -s "$kern_ip" -p "$port_" -C 1 >"$w/c.out" 2>"$w/c.err"
  crc=$?
  el=$((SECONDS - t0))
  if [ "$crc" -ne 0 ] && [ "$crc" -ne 124 ] && grep -qi 'rejected' "$w/c.out" "$w/c.err"; then
    pass "$name: exit $crc after $el s, \"$(grep -hi -m1 rejected "$w/c.err" "$w/c.out" | head -n1 | cut -c1-160)\""
  else
    fail "$name: exit $(rc_text "$crc") after $el s, want non-zero and a message containing \"rejected\""
  fi
  show_cut "$w/c.out" "ufab cmatose stdout"; show_cut "$w/c.err" "ufab cmatose stderr"

  port; good=$port_
  port; bad=$port_
  name="kernel ucmatose -s $ufab_ip -p $bad, while ufab cmatose listens on $good: rejected (invalid service id)"
  rm -f "$w"/[cs].*
  timeout "$limit" "$ufab" cmatose "$ufab_bdf" --ip "$ufab_ip" -p "$good" -C 10 >"$w/s.out" 2>"$w/s.err" &
  upid=$!
  if ! wait_ufab_listen "$upid" 60; then
    not_listening
    fail "$name: ufab cmatose $nl_why"
    show_cut "$w/s.out" "ufab cmatose stdout"; show_cut "$w/s.err" "ufab cmatose stderr"
    return
  fi
  timeout "$limit" stdbuf -oL ucmatose -s "$ufab_ip" -b "$kern_ip" -p "$bad" -C 1 >"$w/c.out" 2>"$w/c.err"; crc=$?
  if [ "$crc" -ne 0 ] && [ "$crc" -ne 124 ] && grep -q 'RDMA_CM_EVENT_REJECTED, error: 8' "$w/c.out" "$w/c.err"; then
    pass "$name: exit $crc, $(grep -h -m1 REJECTED "$w/c.out" "$w/c.err" | head -n1)"
  else
    fail "$name: exit $(rc_text "$crc"), want non-zero and \"RDMA_CM_EVENT_REJECTED, error: 8\""
    show_cut "$w/c.out" "kernel ucmatose stdout"; show_cut "$w/c.err" "kernel ucmatose stderr"
  fi
  rm -f "$w"/c.*
  name="after that REJ, the same ufab cmatose server serves kernel ucmatose on port $good, -C 10"
  timeout "$limit" stdbuf -oL ucmatose -s "$ufab_ip" -b "$kern_ip" -p "$good" -C 10 >"$w/c.out" 2>"$w/c.err"; crc=$?
  wait_bounded "$upid"; src=$?
  if [ "$crc" -eq 0 ] && [ "$src" -eq 0 ] && grep -q 'test complete' "$w/c.out" && grep -q 'test complete' "$w/s.out"; then
    pass "$name: both exited 0 and said \"test complete\""
  else
    fail "$name: kernel exit $(rc_text "$crc"), ufab exit $(rc_text "$src"), want 0 and \"test complete\" from both"
    rxe_diag
  fi
  show_cut "$w/c.out" "kernel ucmatose stdout"; [ -s "$w/c.err" ] && show_cut "$w/c.err" "kernel ucmatose stderr"
  show_cut "$w/s.out" "ufab cmatose stdout"; [ -s "$w/s.err" ] && show_cut "$w/s.err" "ufab cmatose stderr"
}

# REJ both ways with rping and `ufab rping`.
reject_rping() {
  local name t0 el

  # ufab connects to a port nothing on rxe0 listens on: the kernel's ib_cm
  # answers the REQ with a REJ (invalid service id).
  port
  name="ufab rping -c to $kern_ip port $port_, where nothing listens: rejected"
  rm -f "$w"/c.*
  t0=$SECONDS
  timeout "$limit" "${ufab_rping[@]}" -c -a "$kern_ip" -p "$port_" -C 1 >"$w/c.out" 2>"$w/c.err"
  crc=$?
  el=$((SECONDS - t0))
  if [ "$crc" -ne 0 ] && [ "$crc" -ne 124 ] && grep -qi 'rejected' "$w/c.out" "$w/c.err"; then
    pass "$name: exit $crc after $el s, \"$(grep -hi -m1 rejected "$w/c.err" "$w/c.out" | head -n1 | cut -c1-160)\""
  else
    fail "$name: exit $(rc_text "$crc") after $el s, want non-zero and a message containing \"rejected\""
  fi
  show_cut "$w/c.out" "ufab rping -c stdout"; show_cut "$w/c.err" "ufab rping -c stderr"

  # The kernel connects to a port ufab does not listen on while ufab
  # listens on another: ufab's CM answers with a REJ, rping reports
  # RDMA_CM_EVENT_REJECTED with the reason (8, invalid service id). Then a
  # kernel client on the right port is served by the same ufab server.
  port
  local good=$port_
  port
  local bad=$port_
  name="kernel rping -c to ufab's $ufab_ip port $bad, while ufab rping -s listens on $good: rejected (invalid service id)"
  rm -f "$w"/[cs].*
  if ! ufab_server_bg "$good" 64 "$count"; then
    not_listening
    fail "$name: ufab rping -s $nl_why"
    show_cut "$w/s.out" "ufab rping -s stdout"; show_cut "$w/s.err" "ufab rping -s stderr"
    return
  fi
  kernel_client "$ufab_ip" "$bad" 64 1; crc=$?
  if [ "$crc" -ne 0 ] && [ "$crc" -ne 124 ] && grep -q 'RDMA_CM_EVENT_REJECTED, error 8' "$w/c.err"; then
    pass "$name: exit $crc, $(grep -m1 REJECTED "$w/c.err")"
  else
    fail "$name: exit $(rc_text "$crc"), want non-zero and \"RDMA_CM_EVENT_REJECTED, error 8\""
    show_cut "$w/c.out" "kernel rping -c stdout"; show_cut "$w/c.err" "kernel rping -c stderr"
  fi
  rm -f "$w"/c.*
  kernel_client "$ufab_ip" "$good" 64 "$count"; crc=$?
  wait_bounded "$upid"; src=$?
  check_rping "after that REJ, the same ufab rping -s serves kernel rping -c on port $good" 64 "$count" "kernel rping" "ufab rping"
}

# ucm_ufab_client COUNT [LABEL]: kernel ucmatose server, ufab cmatose
# client (`ufab cmatose DEVICE --ip A.B.C.D` takes ucmatose's options,
# docs/cli.md).
ucm_ufab_client() {
  local n=$1 name
  port
  name="${2:-}kernel ucmatose server, ufab cmatose client, -C $n (port $port_)"
  rm -f "$w"/[cs].*
  timeout "$limit" stdbuf -oL ucmatose -b "$kern_ip" -p "$port_" -C "$n" >"$w/s.out" 2>"$w/s.err" &
  spid=$!
  wait_cm_listen "$spid" 30 "$port_" || say "no rdma_cm listener on port $port_ after 30 s; trying the client anyway"
  timeout "$limit" "$ufab" cmatose "$ufab_bdf" --ip "$ufab_ip" -s "$kern_ip" -p "$port_" -C "$n" >"$w/c.out" 2>"$w/c.err"
  crc=$?
  wait_bounded "$spid"; src=$?
  if [ "$crc" -eq 0 ] && [ "$src" -eq 0 ] && grep -q 'test complete' "$w/s.out" && grep -q 'test complete' "$w/c.out"; then
    pass "$name: both exited 0 and said \"test complete\""
  else
    fail "$name: ufab exit $(rc_text "$crc"), kernel exit $(rc_text "$src"), want 0 and \"test complete\" from both"
    rxe_diag
  fi
  show_cut "$w/c.out" "ufab cmatose stdout"; [ -s "$w/c.err" ] && show_cut "$w/c.err" "ufab cmatose stderr"
  show_cut "$w/s.out" "kernel ucmatose stdout"; [ -s "$w/s.err" ] && show_cut "$w/s.err" "kernel ucmatose stderr"
}

# ucm_ufab_server COUNT [LABEL]: ufab cmatose server, kernel ucmatose client.
ucm_ufab_server() {
  local n=$1 name
  port
  name="${2:-}ufab cmatose server, kernel ucmatose client, -C $n (port $port_)"
  rm -f "$w"/[cs].*
  timeout "$limit" "$ufab" cmatose "$ufab_bdf" --ip "$ufab_ip" -p "$port_" -C "$n" >"$w/s.out" 2>"$w/s.err" &
  upid=$!
  if ! wait_ufab_listen "$upid" 60; then
    not_listening
    fail "$name: ufab cmatose $nl_why"
    show_cut "$w/s.out" "ufab cmatose stdout"; show_cut "$w/s.err" "ufab cmatose stderr"
    return
  fi
  timeout "$limit" stdbuf -oL ucmatose -s "$ufab_ip" -b "$kern_ip" -p "$port_" -C "$n" >"$w/c.out" 2>"$w/c.err"; crc=$?
  wait_bounded "$upid"; src=$?
  if [ "$crc" -eq 0 ] && [ "$src" -eq 0 ] && grep -q 'test complete' "$w/c.out" && grep -q 'test complete' "$w/s.out"; then
    pass "$name: both exited 0 and said \"test complete\""
  else
    fail "$name: kernel exit $(rc_text "$crc"), ufab exit $(rc_text "$src"), want 0 and \"test complete\" from both"
    rxe_diag
  fi
  show_cut "$w/c.out" "kernel ucmatose stdout"; [ -s "$w/c.err" ] && show_cut "$w/c.err" "kernel ucmatose stderr"
  show_cut "$w/s.out" "ufab cmatose stdout"; [ -s "$w/s.err" ] && show_cut "$w/s.err" "ufab cmatose stderr"
}

have_cmatose=0
has_ufab_cmd cmatose && have_cmatose=1

case_ucmatose() {
  if [ "$have_cmatose" != 1 ]; then
    skip "ucmatose against ufab, both roles: this ufab has no cmatose command (ucmatose's protocol over ufab's CM)"
    return
  fi
  wire_cases+=(ucmatose)
  ucm_ufab_client 10
  ucm_ufab_server 10
}

case_loss() {
  [ "$have_rping" = 1 ] || fail "2% loss, rping cases: no 'ufab rping' command in $ufab"
  [ "$have_cmatose" = 1 ] || skip "2% loss, ucmatose cases: this ufab has no cmatose command"
  [ "$have_rping" = 1 ] || [ "$have_cmatose" = 1 ] || return
  wire_cases+=(loss)
  lossy_modules
  if ! { pin_neighbour && lossy egress; }; then
    fail "could not set up netem loss 2% on $ifname (sch_netem)"
    lossy off; unpin_neighbour
    return
  fi
  local saved=$limit saved_grace=$grace
  limit=300  # a lost REQ or REP costs ib_cm's response timeout (about 4 s at rdma_cm's 20) and more
  grace=90   # and so does a lost DREQ or DREP
  if [ "$have_rping" = 1 ]; then
    rping_ufab_client "$loss_size" "$loss_count" "2% loss rxe->ufab (egress): "
    rping_ufab_server "$loss_size" "$loss_count" "2% loss rxe->ufab (egress): "
  fi
  if [ "$have_cmatose" = 1 ]; then
    ucm_ufab_client "$loss_count" "2% loss rxe->ufab (egress): "
    ucm_ufab_server "$loss_count" "2% loss rxe->ufab (egress): "
  fi
  limit=$saved grace=$saved_grace
  echo "--- tc -s qdisc show dev $ifname"
  lossy_stats egress | sed 's/^/  | /'
  lossy off
  unpin_neighbour
}

for c in $cases; do
  case $c in
    kernel|client|server|jumbo|reject|ucmatose|loss) "case_$c" ;;
    *) fail "UFAB_CM_CASES: unknown case '$c' (kernel client server jumbo reject ucmatose loss)" ;;
  esac
done

echo "CM_WIRE_CASES ${wire_cases[*]}"
echo "--- rxe0 hw_counters"
rxe_counters
[ "$skipped" -eq 0 ] || say "$skipped skipped (see the SKIP lines)"
rm -rf "$w"
finish
