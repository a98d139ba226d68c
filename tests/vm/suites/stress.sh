#!/usr/bin/env bash
# VM suite for threads over real NIC models, one VM boot: the lanes stress
# (8 threads, each its own QP pair, 10^5 sequence-checked SENDs each plus a
# byte-checked READ every 64th) over two vfio-bound e1000e on the hub and
# over two vfio-bound virtio-net with two queue pairs each, 2 lanes per
# device (tests/vm/cases/stress_vm_test.cc).
# Needs `bazel build //tools/ufab //tests/vm/cases:stress_vm_test` (scripts/test.sh
# builds //...). UFAB_STRESS_MESSAGES=N sets the SENDs per thread.
# Under TCG (one vCPU) on the 2-core build machine each case took about
# 100 s and the whole suite 4 min (boot included); a case is bounded at
# 600 s (UFAB_STRESS_TIMEOUT), the VM at 1500 s.
# Ends with "stress: N passed, M failed".
set -uo pipefail
cd "$(dirname "$0")/../../.."
bin=$PWD/bazel-bin
out=$(mktemp)
trap 'rm -f "$out"' EXIT

# NICs 1-2 e1000e (00:02.0, 00:03.0) on the hub. Two virtio-net NICs
# (00:0a.0, 00:0b.0) with two queue pairs each: QEMU gives virtio-net as many
# pairs as its backend has queues, and the hub has one, so each sits on a
# multi-queue tap (queues=2, mq=on), the two taps bridged inside a private
# network namespace (unshare -n), as the drivers suite does: nothing touches
# the host's network. After the VM, the namespace's shell prints how many
# frames each tap queue handed to the guest (tap queue i feeds the NIC's RX
# queue i): both queues of both NICs must have carried traffic. Where the
# namespace or /dev/net/tun is not available, the virtio case skips (it says
# so).
. tests/vm/mq_taps.sh
vm_kernel_ready stress || exit 1
mq_env=()
if mq_taps stress ufabst 02; then
  mq_env=(--env UFAB_STRESS_VIRTIO=0000:00:0a.0,0000:00:0b.0)
else
  echo "stress: no private network namespace with taps here (needs root, unshare, ip, tc, /dev/net/tun): the virtio-net case will skip"
fi

guest=$(cat <<GUEST
modprobe vfio-pci || exit 1
for d in 0000:00:02.0 0000:00:03.0 $mq_bdfs; do $bin/tools/ufab/ufab bind \$d >/dev/null || exit 1; done
$bin/tests/vm/cases/stress_vm_test
GUEST
)
start=$(date +%s)
${mq_wrap[@]+"${mq_wrap[@]}"} tests/vm/run-vm --timeout 1500 --mem 2048 \
  --nic e1000e --nic e1000e \
  --env UFAB_STRESS_E1000E=0000:00:02.0,0000:00:03.0 \
  ${mq_env[@]+"${mq_env[@]}"} ${mq_args[@]+"${mq_args[@]}"} \
  -- sh -c "$guest" 2>&1 | tee "$out"
rc=${PIPESTATUS[0]}
echo "stress: VM run took $(( $(date +%s) - start )) s"

passed=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$out" | tail -n1)
failed=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' "$out" | tail -n1)
passed=${passed:-0}; failed=${failed:-0}
if [ "$rc" -ne 0 ] && [ "$failed" -eq 0 ]; then failed=1; fi  # the VM or the binary failed

# Outside the guest: each virtio-net NIC's two RX queues both got frames
# (one check per NIC), when the virtio case ran and passed.
if [ -n "$mq_bdfs" ] && grep -q '^\[       OK \] StressVm.VirtioNet' "$out"; then
  for t in ufabst0 ufabst1; do
    q0=$(sed -n "s/^stress: tap $t queue 0 delivered \([0-9]*\) frames/\1/p" "$out")
    q1=$(sed -n "s/^stress: tap $t queue 1 delivered \([0-9]*\) frames/\1/p" "$out")
    if [ "${q0:-0}" -gt 0 ] && [ "${q1:-0}" -gt 0 ]; then
      passed=$((passed + 1))
    else
      echo "stress: tap $t: a queue delivered nothing (queue 0: ${q0:-?}, queue 1: ${q1:-?}): the NIC's two RX queues did not both carry traffic"
      failed=$((failed + 1)); rc=1
    fi
  done
fi
echo "stress: $passed passed, $failed failed"
[ "$rc" -eq 0 ] && [ "$failed" -eq 0 ]
