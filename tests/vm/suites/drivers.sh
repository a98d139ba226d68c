#!/usr/bin/env bash
# VM suite for the driver plugins, one VM boot: e1000e and virtio-net driven
# from user space through VFIO (frames between them, interrupt mode, frames
# to and from a kernel-driven NIC), then each driver's own checks, then the
# RDMA test over the two e1000e at mtu=9000 (path MTU 4096).
# Ends with "drivers: N passed, M failed".
set -uo pipefail
cd "$(dirname "$0")/../../.."
bin=$PWD/bazel-bin
out=$(mktemp)
trap 'rm -f "$out"' EXIT

# NICs 1-2 e1000e (00:02.0, 00:03.0), 3-4 virtio (00:04.0, 00:05.0): bound to
# vfio-pci; NIC 5 e1000e (00:06.0) stays with the kernel's e1000e driver.
#
# Two more virtio-net NICs (00:0a.0, 00:0b.0) with two queue pairs each, for
# the multiqueue test: QEMU gives virtio-net as many queue pairs as its
# backend has queues, and the hub has one, so these sit on a multiqueue tap
# each (queues=2, mq=on), the two taps bridged inside a private network
# namespace (unshare -n): nothing touches the host's network. Where that
# namespace or /dev/net/tun is not available, they are left out and the
# test skips (it says so).
. tests/vm/mq_taps.sh
vm_kernel_ready drivers || exit 1
mq_env=()
if mq_taps drivers ufabmq 01; then
  mq_env=(--env UFAB_VIRTIO_MQ=0000:00:0a.0,0000:00:0b.0)
else
  echo "drivers: no private network namespace with taps here (needs root, unshare, ip, tc, /dev/net/tun): the virtio multiqueue test will skip"
fi

guest=$(cat <<GUEST
modprobe vfio-pci || exit 1
for d in 0000:00:02.0 0000:00:03.0 0000:00:04.0 0000:00:05.0 $mq_bdfs; do $bin/tools/ufab/ufab bind \$d >/dev/null || exit 1; done
export UFAB_KERNEL_IF=\$(ls /sys/bus/pci/devices/0000:00:06.0/net)
rc=0
for t in raw_frames_vm_test e1000e_vm_test virtio_net_vm_test; do
  echo "== \$t"
  $bin/tests/vm/cases/\$t
  trc=\$?
  if [ \$trc -ne 0 ]; then echo "drivers: \$t exited with status \$trc"; rc=1; fi
done
# Jumbo frames end to end: the two e1000e at mtu=9000 as RDMA devices, path
# MTU 4096, every operation up to 1 MiB both ways, every byte checked.
echo "== rdma_vm_test over e1000e mtu=9000"
UFAB_RDMA_PORTS=0000:00:02.0,0000:00:03.0 UFAB_RDMA_PARAMS=mtu=9000 UFAB_RDMA_PATH_MTU=4096 \
  $bin/tests/vm/cases/rdma_vm_test || { echo "drivers: rdma_vm_test at mtu=9000 failed"; rc=1; }
exit \$rc
GUEST
)
${mq_wrap[@]+"${mq_wrap[@]}"} tests/vm/run-vm --timeout 1500 --mem 2048 \
  --nic e1000e --nic e1000e --nic virtio --nic virtio --nic e1000e \
  --env UFAB_E1000E=0000:00:02.0,0000:00:03.0 --env UFAB_VIRTIO=0000:00:04.0,0000:00:05.0 \
  ${mq_env[@]+"${mq_env[@]}"} ${mq_args[@]+"${mq_args[@]}"} \
  -- sh -c "$guest" 2>&1 | tee "$out"
rc=${PIPESTATUS[0]}

# Sum the gtest summaries of the three programs.
passed=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$out" | awk '{s+=$1} END {print s+0}')
failed=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' "$out" | awk '{s+=$1} END {print s+0}')
if [ "$rc" -ne 0 ] && [ "$failed" -eq 0 ]; then failed=1; fi
echo "drivers: $passed passed, $failed failed"
[ "$rc" -eq 0 ]
