#!/usr/bin/env bash
# Runs in the VM (tests/vm/suites/rxe_flush.sh boots it with two e1000e
# NICs and an emulated NVDIMM, run-vm --nvdimm): FLUSH and ATOMIC_WRITE
# between ufab and Linux soft-RoCE, every result checked in the target's
# memory. ufab (tests/vm/cases/flush_peer) drives NIC 1 (00:02.0,
# vfio-pci, 10.0.0.2); rxe0 sits on NIC 2 (00:03.0, kernel e1000e,
# 10.0.0.1) under tests/vm/peers/flush_verbs (libibverbs). The TCP
# exchange goes over 127.0.0.1.
#
#  0. The NVDIMM's region gets a label area (ndctl init-labels) and one
#     devdax namespace: /dev/dax0.0, persistent memory that rxe accepts
#     FLUSH_PERSISTENT on (its pages are "Persistent Memory" in iomem).
#  1. ufab initiator -> rxe target (Debian 12's rdma-core 44 on the target:
#     it passes the raw FLUSH access bits through): WRITE then FLUSH
#     PERSISTENT to an MR on /dev/dax0.0 (range; whole MR), WRITE then FLUSH
#     GLOBAL to an ordinary-memory MR (range; whole MR), ATOMIC_WRITE to
#     both, FLUSH PERSISTENT to the ordinary MR (which lacks it: remote
#     access error), FLUSH on a QP without the FLUSH rights (remote invalid
#     request), and a commit-complete WRITE (kSendCommit: the WRITE and a
#     FLUSH PERSISTENT of its range, one completion) to the devdax MR.
#  2. rxe initiator -> ufab target: ibv_wr_atomic_write (rdma-core 44 has
#     it) into ufab's memory.
#  3. rxe initiator with FLUSH -> ufab target: flush_verbs built against
#     Debian 13's rdma-core 56 (ibv_wr_flush, tests/vm/build-trixie-peer.sh),
#     run chrooted in the trixie root (UFAB_TRIXIE_ROOT), the cases of 1 in
#     the other direction, ufab's pmem region on /dev/dax0.0 registered as
#     persistent memory. Without UFAB_TRIXIE_ROOT and UFAB_TRIXIE_PEER (the
#     suite could not make them) this part is one FAIL line saying why.
#
# Environment: FLUSH_PEER_BIN, FLUSH_VERBS_BIN (default: this checkout's
# bazel-bin), UFAB_BIN (the ufab CLI, for bind), UFAB_TRIXIE_ROOT,
# UFAB_TRIXIE_PEER, UFAB_FLUSH_LIMIT (seconds for one side of one run,
# default 120; each wait inside is --timeout 30), UFAB_FLUSH_PARTS (default
# "1 2 3": which of the parts above run), UFAB_FLUSH_VERBOSE=1 (both sides'
# output after passing runs too).
# Each part also checks that ufab's transport counted no parse errors (every
# frame rxe sent passed ufab's parser, ICRC verified).
# Prints "PASS ..."/"FAIL ..." per case and ends with
# "rxe_flush_guest: N passed, M failed".
# shellcheck disable=SC2034  # target, initiator: run_pair's arrays, passed by name
set -uo pipefail
here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
root=$(cd -- "$here/../.." && pwd)
ufab=${UFAB_BIN:-$root/bazel-bin/tools/ufab/ufab}
peer_bin=${FLUSH_PEER_BIN:-$root/bazel-bin/tests/vm/cases/flush_peer}
verbs_bin=${FLUSH_VERBS_BIN:-$root/bazel-bin/tests/vm/peers/flush_verbs}
ufab_bdf=${UFAB_VM_NIC1_BDF:-0000:00:02.0}
kern_bdf=${UFAB_VM_NIC2_BDF:-0000:00:03.0}
limit=${UFAB_FLUSH_LIMIT:-120}
trixie=${UFAB_TRIXIE_ROOT:-}
trixie_peer=${UFAB_TRIXIE_PEER:-}
parts=" ${UFAB_FLUSH_PARTS:-1 2 3} "
w=$(mktemp -d)
passed=0 failed=0
prog=rxe_flush_guest
pinned=0
# say, pass, fail, finish, show, wait_line, rxe_setup, rxe_diag, forget_neighbour
# shellcheck source=tests/vm/rxe_guest_lib.sh
. "$here/rxe_guest_lib.sh"

for b in "$ufab" "$peer_bin" "$verbs_bin"; do
  [ -x "$b" ] || { fail "$b is missing (bazel build //tools/ufab //tests/vm/cases:flush_peer //tests/vm/peers:flush_verbs)"; finish; }
done

# ------------------------------------------------------------------ setup
timeout 60 modprobe vfio-pci || { fail "modprobe vfio-pci"; finish; }
timeout 60 "$ufab" bind "$ufab_bdf" >/dev/null || { fail "ufab bind $ufab_bdf"; finish; }
ifname=$(ls "/sys/bus/pci/devices/$kern_bdf/net" 2>/dev/null | head -n1)
[ -n "$ifname" ] || { fail "no kernel interface on $kern_bdf"; finish; }
rxe_setup "$ifname" 10.0.0.1 || { fail "rxe0 on $ifname (the line above says which step failed)"; finish; }
idx=$rxe_gid_index

# The devdax namespace. QEMU's label area starts empty, so the region is
# label-less (a raw namespace0.0): give it labels, then one devdax
# namespace of 2 MiB pages. The region is the NVDIMM less its 128 KiB of
# labels, and a namespace is a multiple of the region's 16 MiB alignment.
command -v ndctl >/dev/null || { fail "ndctl is missing (apt-get install ndctl daxctl; scripts/setup.sh does)"; finish; }
[ -e /sys/bus/nd/devices/region0 ] || { fail "no NVDIMM region0 (run-vm --nvdimm loads nfit; see the console)"; finish; }
size_mb=$(( (${UFAB_VM_NVDIMM_MB:-0} - 1) / 16 * 16 ))
if { timeout 60 ndctl disable-region region0 && timeout 60 ndctl init-labels -f nmem0 &&
  timeout 60 ndctl enable-region region0 &&
  timeout 60 ndctl create-namespace --mode=devdax -r region0 --size="${size_mb}M" --align=2M; } >"$w/ndctl.out" 2>&1 &&
  [ -c /dev/dax0.0 ]; then
  pmem_range=$(grep -m1 'Persistent Memory' /proc/iomem | sed 's/^ *//')
  pass "devdax namespace /dev/dax0.0 ($(cat /sys/bus/dax/devices/dax0.0/size 2>/dev/null) bytes, align $(cat /sys/bus/dax/devices/dax0.0/align 2>/dev/null)) on the NVDIMM; iomem: ${pmem_range:-no Persistent Memory range}"
else
  fail "ndctl could not make a devdax namespace on region0"
  show "$w/ndctl.out" "ndctl"
  finish
fi
say "rxe0 on $ifname, GID index $idx = ::ffff:10.0.0.1; ufab on $ufab_bdf"

# One run: the target in the background, the initiator once the target
# prints its port. T and I are commands (arrays by name); the initiator's
# output is $w/i.out, the target's $w/t.out.
run_pair() { # TARGET_ARRAY INITIATOR_ARRAY
  local -n tcmd=$1 icmd=$2
  local tpid port
  rm -f "$w"/t.* "$w"/i.*
  : >"$w/i.out"; : >"$w/i.err"
  forget_neighbour
  timeout "$limit" "${tcmd[@]}" >"$w/t.out" 2>"$w/t.err" &
  tpid=$!
  irc=125
  if wait_line "$w/t.out" 'listening on TCP port' "$tpid" 60; then
    port=$(sed -n 's/.*listening on TCP port \([0-9][0-9]*\).*/\1/p' "$w/t.out")
    timeout "$limit" "${icmd[@]}" --connect "127.0.0.1:$port" >"$w/i.out" 2>"$w/i.err"
    irc=$?
  else
    echo "the initiator did not run: the target printed no port" >"$w/i.err"
  fi
  wait "$tpid"
  trc=$?
}

# report LABEL PROG CASE:DESCRIPTION...: one PASS/FAIL per expected case,
# from the initiator's "PROG: case NAME: OK|FAILED: ..." lines; both sides'
# output after a failure.
report() {
  local label=$1 p=$2 any=0 c name desc line
  shift 2
  for c in "$@"; do
    name=${c%%:*} desc=${c#*:}
    line=$(grep -m1 "^$p: case $name: " "$w/i.out")
    if [[ $line == "$p: case $name: OK: "* ]]; then
      pass "$label: $desc: ${line#"$p: case $name: OK: "}"
    elif [ -n "$line" ]; then
      fail "$label: $desc: ${line#"$p: case $name: FAILED: "}"; any=1
    else
      fail "$label: $desc: no result (initiator exited $irc, target $trc)"; any=1
    fi
  done
  if [ "$trc" -ne 0 ] || { [ "$irc" -ne 0 ] && [ "$any" -eq 0 ]; }; then
    fail "$label: initiator exited $irc, target $trc"; any=1
  fi
  # ufab's side (whichever role) parsed every frame rxe sent, ICRC verified:
  # FLUSH's included, whose ICRC rxe computes its own way (core/roce/icrc.h).
  local uf
  uf=$(grep -h '^flush_peer: transport: ' "$w/t.out" "$w/i.out" | tail -n1)
  if [[ $uf == *", parse errors 0,"* ]]; then
    pass "$label: ufab parsed every frame rxe sent, ICRCs verified (${uf#flush_peer: transport: })"
  else
    fail "$label: ufab's transport counted parse errors, or printed no counters: '${uf:-none}'"; any=1
  fi
  if [ "$any" -ne 0 ] || [ "${UFAB_FLUSH_VERBOSE:-0}" = 1 ]; then
    show "$w/t.out" "target stdout"; [ -s "$w/t.err" ] && show "$w/t.err" "target stderr"
    show "$w/i.out" "initiator stdout"; [ -s "$w/i.err" ] && show "$w/i.err" "initiator stderr"
    [ "$any" -eq 0 ] || rxe_diag
  fi
}

wait_s=${UFAB_FLUSH_WAIT:-30}
ufab_side=("$peer_bin" --device "$ufab_bdf" --ip 10.0.0.2 --timeout "$wait_s")
verbs_side=("$verbs_bin" --device rxe0 --gid-index "$idx" --timeout "$wait_s")
flush_cases=(
  "persistent-range:RDMA_WRITE then FLUSH PERSISTENT (range) to an MR on /dev/dax0.0"
  "persistent-mr:RDMA_WRITE then FLUSH PERSISTENT (whole MR) to an MR on /dev/dax0.0"
  "global-range:RDMA_WRITE then FLUSH GLOBAL (range) to an ordinary-memory MR"
  "global-mr:RDMA_WRITE then FLUSH GLOBAL (whole MR) to an ordinary-memory MR"
  "atomic-write:ATOMIC_WRITE to an ordinary-memory MR"
  "atomic-write-pmem:ATOMIC_WRITE to the MR on /dev/dax0.0"
  "missing-type:FLUSH PERSISTENT to an MR without FLUSH_PERSISTENT is a remote access error"
  "qp-no-flush:FLUSH to a QP without the FLUSH rights is a remote invalid request"
)
# ufab's commit-complete WRITE, as initiator only (rxe has no such flag).
commit_case="commit-write:RDMA_WRITE with kSendCommit (WRITE + FLUSH PERSISTENT of its range) to an MR on /dev/dax0.0, completed once"
names() { local c out=; for c in "$@"; do out+=${out:+,}${c%%:*}; done; echo "$out"; }

# ------------------------------------------------ 1. ufab -> rxe (rdma-core 44)
if [[ $parts == *" 1 "* ]]; then
  target=("${verbs_side[@]}" --listen 0 --pmem /dev/dax0.0)
  initiator=("${ufab_side[@]}" --cases "$(names "${flush_cases[@]}" "$commit_case")")
  run_pair target initiator
  report "ufab -> rxe" flush_peer "${flush_cases[@]}" "$commit_case"
fi

# ------------------------------------------------ 2. rxe (rdma-core 44) -> ufab
if [[ $parts == *" 2 "* ]]; then
  target=("${ufab_side[@]}" --listen 0)
  initiator=("${verbs_side[@]}" --cases atomic-write)
  run_pair target initiator
  report "rxe (rdma-core 44) -> ufab" flush_verbs "atomic-write:ibv_wr_atomic_write (ibv_qp_ex) into ufab's ordinary memory"
fi

# ------------------------------------------------ 3. rxe (rdma-core 56, trixie) -> ufab
if [[ $parts != *" 3 "* ]]; then
  :
elif [ -z "$trixie" ] || [ -z "$trixie_peer" ] || [ ! -x "$trixie/bin/sh" ] || [ ! -x "$trixie_peer" ]; then
  fail "rxe (rdma-core 56) -> ufab: no trixie chroot or FLUSH-capable flush_verbs (UFAB_TRIXIE_ROOT='$trixie', UFAB_TRIXIE_PEER='$trixie_peer'): the suite's tests/vm/build-trixie-peer.sh failed, see its output"
else
  # The chroot is on the guest's overlay (writable, the host's copy is not
  # touched): the guest's /proc, /sys and /dev (rxe0's uverbs device, the
  # devdax device) inside it, and the peer binary.
  ok=1
  for m in proc sys dev; do
    mountpoint -q "$trixie/$m" || mount --bind "/$m" "$trixie/$m" || { ok=0; fail "mount --bind /$m $trixie/$m"; }
  done
  mkdir -p "$trixie/ufab" && cp "$trixie_peer" "$trixie/ufab/flush_verbs" || { ok=0; fail "copying $trixie_peer into $trixie/ufab"; }
  if [ "$ok" = 1 ]; then
    say "rdma-core in the chroot: $(cat "$trixie/.ufab-complete" 2>/dev/null)"
    target=("${ufab_side[@]}" --listen 0 --pmem /dev/dax0.0)
    initiator=(chroot "$trixie" /ufab/flush_verbs --device rxe0 --gid-index "$idx" --timeout "$wait_s"
      --cases "$(names "${flush_cases[@]}")")
    run_pair target initiator
    report "rxe (rdma-core 56) -> ufab" flush_verbs "${flush_cases[@]}"
  fi
  for m in dev sys proc; do umount "$trixie/$m" 2>/dev/null; done
fi

echo "--- rxe0 hw_counters"
rxe_counters
rm -rf "$w"
finish
