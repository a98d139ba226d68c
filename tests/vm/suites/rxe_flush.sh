#!/usr/bin/env bash
# VM suite: FLUSH and ATOMIC_WRITE between ufab and Linux soft-RoCE
# (rdma_rxe, 6.12), one VM boot with two e1000e NICs and an emulated NVDIMM
# (run-vm --nvdimm 256). tests/vm/rxe_flush_guest.sh makes a devdax
# namespace on the NVDIMM and runs tests/vm/cases/flush_peer (ufab, NIC 1 on
# vfio-pci) against tests/vm/peers/flush_verbs (libibverbs on rxe0, NIC 2),
# each result checked in the target's memory:
#   ufab -> rxe: WRITE + FLUSH PERSISTENT (range, whole MR) to an MR on
#     /dev/dax0.0, WRITE + FLUSH GLOBAL (range, whole MR) to ordinary
#     memory, ATOMIC_WRITE to both, a FLUSH type the MR lacks (remote
#     access error), a QP without the FLUSH rights (remote invalid request),
#     ufab's commit-complete WRITE (kSendCommit) to the devdax MR;
#   rxe -> ufab: ATOMIC_WRITE with Debian 12's rdma-core 44;
#   rxe -> ufab with FLUSH: the same cases as the first direction, with
#     flush_verbs built against Debian 13's rdma-core 56 (ibv_wr_flush) and
#     run chrooted in a trixie root, both made here beforehand by
#     tests/vm/build-trixie-peer.sh (which calls fetch-trixie-verbs.sh: a
#     debootstrap of about 190 MB the first time, cached in
#     ~/.cache/ufab/trixie-verbs; later runs download nothing).
# Each part also checks ufab's parse-error count (0: every rxe frame's
# ICRC verified). About 45 s in all under TCG once the caches are filled.
# docs/interop.md describes it.
# Needs: bazel build //tools/ufab //tests/vm/cases:flush_peer
# //tests/vm/peers:flush_verbs; ndctl, debootstrap, rdma-core,
# ibverbs-providers, iproute2 on the host (scripts/setup.sh installs them).
# UFAB_FLUSH_PARTS, UFAB_FLUSH_VERBOSE and UFAB_FLUSH_WAIT pass through to
# the guest script (see there); UFAB_FLUSH_PARTS="1 2" runs without the
# trixie part (nothing is debootstrapped or built for it then).
# Ends with "rxe_flush: N passed, M failed".
set -uo pipefail
cd "$(dirname "$0")/../../.." || exit 1
out=$(mktemp)
trap 'rm -f "$out"' EXIT

passed=0 failed=0
finish() {
  echo "rxe_flush: $passed passed, $failed failed"
  [ "$failed" -eq 0 ]
  exit
}
for b in tools/ufab/ufab tests/vm/cases/flush_peer tests/vm/peers/flush_verbs; do
  [ -x "bazel-bin/$b" ] || {
    echo "FAIL bazel-bin/$b is not built (bazel build //tools/ufab //tests/vm/cases:flush_peer //tests/vm/peers:flush_verbs)"
    failed=1; finish
  }
done
command -v ndctl >/dev/null || { echo "FAIL ndctl missing (apt-get install ndctl daxctl; scripts/setup.sh does)"; failed=1; finish; }

envs=(--env "UFAB_BIN=$PWD/bazel-bin/tools/ufab/ufab")
for v in UFAB_FLUSH_PARTS UFAB_FLUSH_VERBOSE UFAB_FLUSH_WAIT; do
  [ -z "${!v:-}" ] || envs+=(--env "$v=${!v}")
done
# The FLUSH-capable verbs peer: the trixie root and the binary, both cached.
if [[ " ${UFAB_FLUSH_PARTS:-3} " == *" 3 "* ]]; then
  echo "rxe_flush: the Debian 13 (rdma-core 56) verbs peer (tests/vm/build-trixie-peer.sh)"
  if peer=$(tests/vm/build-trixie-peer.sh | tail -n1) && [ -x "$peer" ]; then
    root=$(tests/vm/fetch-trixie-verbs.sh --quiet | tail -n1)
    envs+=(--env "UFAB_TRIXIE_ROOT=$root" --env "UFAB_TRIXIE_PEER=$peer")
  else
    echo "rxe_flush: tests/vm/build-trixie-peer.sh failed (above); the trixie part will report it"
  fi
fi

# Two vCPUs: rxe's work and ufab's progress thread run side by side.
tests/vm/run-vm --timeout 600 --mem 2048 --smp 2 --nvdimm 256 --nic e1000e --nic e1000e "${envs[@]}" \
  -- tests/vm/rxe_flush_guest.sh 2>&1 | tee "$out"
rc=${PIPESTATUS[0]}
passed=$(grep -c '^PASS ' "$out")
failed=$(grep -c '^FAIL ' "$out")
if [ "$rc" -ne 0 ] && [ "$failed" -eq 0 ]; then failed=1; echo "FAIL the VM run exited with $rc"; fi
finish
