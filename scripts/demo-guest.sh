#!/usr/bin/env bash
# Runs inside the VM that scripts/demo.sh boots: what an operator does to
# hand a NIC to ufab, move data through it from user space, and give it back.
#
#   1. ufab list, doctor, bind, info: the first Intel NIC (the e1000e, NIC 1)
#      goes to vfio-pci.
#   2. The kernel keeps the other NIC (virtio-net): 10.0.0.1/24 and rxe0,
#      Linux soft-RoCE, on it (rxe_setup in tests/vm/rxe_guest_lib.sh).
#   3. RDMA WRITE and SEND between them: perftest (ib_write_bw, ...) on rxe0
#      against `ufab perf` on the e1000e (10.0.0.2, driven through VFIO),
#      each pair run and checked by tests/vm/rxe_perftest_guest.sh; then a
#      table of what each side measured.
#   4. rxe0 and the address go; ufab unbind, list: the e1000e goes back to
#      its kernel driver.
#
# Any failed step prints "demo: FAILED: <what>" and exits non-zero. Every
# command is bounded by `timeout`.
set -uo pipefail
UFAB=${1:?usage: demo-guest.sh PATH-TO-UFAB}
here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
prog=demo
# say, rxe_setup, rxe_diag
# shellcheck source=tests/vm/rxe_guest_lib.sh
. "$here/../tests/vm/rxe_guest_lib.sh"

die() { echo "demo: FAILED: $*"; exit 1; }
step() { # COMMAND...: shown, run (60 s at most), and the demo stops if it fails
  local rc
  printf '\n$ %s\n' "$*"
  timeout -k 5 60 "$@"
  rc=$?
  [ "$rc" -eq 0 ] || die "'$*' exited with $rc$([ "$rc" -eq 124 ] && echo ' (ran past 60 s)')"
}

# The transfers: ROLE LOSS TEST OPTIONS, as rxe_perftest_guest.sh reads
# them (ROLE is ufab's; perftest takes the other). Small counts: the VM
# emulates its CPUs (TCG), where each run takes a few seconds.
cases='
server - write-bw  -s 65536 -n 500
client - write-lat -s 64 -n 500
client - send-bw   -s 4096 -n 2000
server - send-lat  -s 64 -n 500
'

# ------------------------------------------------------------ 1. bind
step modprobe vfio-pci
step "$UFAB" list
nic=$(timeout 30 "$UFAB" list --json | jq -r '[.devices[] | select(.vendor_id == "8086")][0].address // empty')
[ -n "$nic" ] || die "ufab list --json shows no Intel NIC to bind"
printf '\n$ %s\n' "$UFAB doctor $nic"
timeout 30 "$UFAB" doctor "$nic" || true # it reports what is not ready yet: the NIC is not bound so far
step "$UFAB" bind "$nic"
step "$UFAB" info "$nic"
step "$UFAB" list

# ------------------------------------------------------------ 2. the kernel side
# The kernel's NIC: the first one that is not ufab's (run-vm names NIC N
# eth(N-1) and says so in UFAB_VM_NIC<N>_BDF and _IF).
kif='' kmodel=''
for ((i = 1; i <= ${UFAB_VM_NIC_COUNT:-0}; i++)); do
  bdf_var=UFAB_VM_NIC${i}_BDF if_var=UFAB_VM_NIC${i}_IF model_var=UFAB_VM_NIC${i}_MODEL
  [ "${!bdf_var}" = "$nic" ] && continue
  kif=${!if_var} kmodel=${!model_var}
  break
done
[ -n "$kif" ] || die "no second NIC for the kernel's rxe (scripts/demo.sh boots the VM with two)"
printf '\n$ %s\n' "rdma link add rxe0 type rxe netdev $kif   # the kernel's soft-RoCE on $kif ($kmodel), 10.0.0.1/24"
rxe_setup "$kif" 10.0.0.1 || die "setting up rxe0 on $kif (the line above says which step)"
timeout 10 rdma link show rxe0/1 || die "rdma link show rxe0/1"
say "rxe0 on $kif: RoCE v2 GID ::ffff:10.0.0.1 at index $rxe_gid_index"

# ------------------------------------------------------------ 3. transfers
n_cases=$(grep -c '^[a-z]' <<<"$cases")
printf '\n$ %s\n' "tests/vm/rxe_perftest_guest.sh   # $n_cases runs: perftest on rxe0 <-> ufab perf on $nic"
w=$(mktemp -d)
t0=$SECONDS
UFAB_BIN=$UFAB RXE_GID_INDEX=$rxe_gid_index KERN_IF=$kif W=$w UFAB_VM_NIC1_BDF=$nic \
  UFAB_PERFTEST_CASES=$cases UFAB_PERFTEST_KEEP=1 UFAB_PERFTEST_LIMIT=60 \
  timeout -k 10 240 "$here/../tests/vm/rxe_perftest_guest.sh"
prc=$?
secs=$((SECONDS - t0))

# The table: one row per side of each run. bw tests: the average bandwidth
# (MB/s, 2^20 bytes) and message rate; lat tests: half the round trip
# (t_typical, the median, and t_avg). Each side prints its own view, except
# the write-bw server: perftest's and ufab's both print the client's report.
# shellcheck disable=SC2059  # the format is the caller's
num() { # VALUE FORMAT: VALUE formatted, or "-" when it is not a number
  [[ $1 =~ ^[0-9]+(\.[0-9]+)?$ ]] && printf "$2" "$1" || echo -
}
fmt='%-10s %6s %5s  %-22s %9s %9s %12s %10s %6s %5s\n'
row() { # TEST SIZE MSGS SIDE BW MPPS TTYP TAVG RETX SECS
  local rate=-
  [ "$6" = - ] || rate=$(awk -v m="$6" 'BEGIN { printf "%.0f", m * 1e6 }')
  # shellcheck disable=SC2059
  printf "$fmt" "$1" "$2" "$3" "$4" "$(num "$5" %.2f)" "$rate" "$(num "$7" %.2f)" "$(num "$8" %.2f)" "$9" "${10}"
}
echo
echo "== RDMA between ufab (user space, $nic on vfio-pci, 10.0.0.2) and the kernel's rxe0 ($kif, $kmodel, 10.0.0.1)"
# shellcheck disable=SC2059
printf "$fmt" TEST 'SIZE B' MSGS SIDE 'BW MB/s' 'msgs/s' 't_typical us' 't_avg us' 'retx' 'TIME'
rows=0
while IFS=$'\t' read -r k verdict role test rsecs _; do
  [ -n "$k" ] || continue
  tool=ib_${test//-/_} peer=server
  [ "$role" = server ] && peer=client
  # ufab's JSON: its last (only) result
  read -r size iters ubw umr utyp uavg uretx <<<"$(jq -r '(.results[-1] // {} | [.size, .iters, .bw_avg, .msg_rate_mpps,
    .t_typical_usec, .t_avg_usec]) + [.transport.retransmits] | map(if . == null then "-" else tostring end) | join(" ")' \
    "$w/run-$k.ufab" 2>/dev/null)"
  # perftest's last result line: bytes iters, then bw_peak bw_avg msg_rate,
  # or t_min t_max t_typical t_avg ...
  read -r -a p <<<"$(awk '/#bytes/ { t = 1; next } t && /^-+$/ { t = 0 } t && $1 ~ /^[0-9]+$/ && $2 ~ /^[0-9]+$/' \
    "$w/run-$k.perftest" 2>/dev/null | tail -n 1)"
  if [ "${test##*-}" = bw ]; then
    row "$test" "${size:--}" "${iters:--}" "ufab perf ($role)" "${ubw:--}" "${umr:--}" - - "${uretx:--}" "${rsecs}s"
    row "" "" "" "$tool ($peer)" "${p[3]:--}" "${p[4]:--}" - - - ""
  else
    row "$test" "${size:--}" "${iters:--}" "ufab perf ($role)" - - "${utyp:--}" "${uavg:--}" "${uretx:--}" "${rsecs}s"
    row "" "" "" "$tool ($peer)" - - "${p[4]:--}" "${p[5]:--}" - ""
  fi
  [ "$verdict" = PASS ] || echo "           ^ this run FAILED (see its FAIL line above)"
  rows=$((rows + 1))
done <"$w/runs.tsv"
echo "(retx: packets ufab sent again. $rows runs in $secs s. TCG emulates the VM's CPUs: the figures show that the path"
echo " works end to end, not how fast ufab or rxe is)"

[ "$prc" -eq 0 ] || die "the transfers: rxe_perftest_guest.sh exited with $prc$([ "$prc" -eq 124 ] && echo ' (ran past 240 s)') (its FAIL lines above say what went wrong)"
[ "$rows" -eq "$n_cases" ] || die "the transfers: $rows of $n_cases runs reported"
rm -rf "$w"

# ------------------------------------------------------------ 4. unbind
step rdma link delete rxe0
step ip addr flush dev "$kif"
step ip link set "$kif" down
step "$UFAB" unbind "$nic"
step "$UFAB" list
echo
echo "demo: done"
