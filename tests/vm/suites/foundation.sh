#!/usr/bin/env bash
# VM suite for the foundation: ufab list/bind/info/unbind/doctor and the VFIO
# layer against QEMU's e1000e and virtio-net (behind the vIOMMU), plus two
# e1000 behind a PCIe-to-PCI bridge, which share one IOMMU group.
# Ends with "foundation: N passed, M failed".
set -uo pipefail
cd "$(dirname "$0")/../../.."
bin=$PWD/bazel-bin
out=$(mktemp)
trap 'rm -f "$out"' EXIT

tests/vm/run-vm --timeout 900 \
  --nic e1000e:52:54:00:00:00:01 --nic virtio:52:54:00:00:00:02 \
  --qemu-arg -device --qemu-arg pcie-pci-bridge,id=br0,bus=pcie.0,addr=0x10 \
  --qemu-arg -netdev --qemu-arg hubport,hubid=0,id=br0nic1 \
  --qemu-arg -device --qemu-arg e1000,netdev=br0nic1,mac=52:54:00:00:01:01,bus=br0,addr=0x1,romfile= \
  --qemu-arg -netdev --qemu-arg hubport,hubid=0,id=br0nic2 \
  --qemu-arg -device --qemu-arg e1000,netdev=br0nic2,mac=52:54:00:00:01:02,bus=br0,addr=0x2,romfile= \
  --env UFAB="$bin/tools/ufab/ufab" \
  --env UFAB_NICS=e1000e=52:54:00:00:00:01,virtio=52:54:00:00:00:02,e1000=52:54:00:00:01:01,e1000=52:54:00:00:01:02 \
  --env UFAB_SHARED_GROUP=0000:01:01.0,0000:01:02.0 \
  -- "$bin/tests/vm/cases/foundation_vm_test" 2>&1 | tee "$out"
rc=${PIPESTATUS[0]}

passed=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$out" | tail -n1)
failed=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' "$out" | tail -n1)
passed=${passed:-0}; failed=${failed:-0}
if [ "$rc" -ne 0 ] && [ "$failed" -eq 0 ]; then failed=1; fi  # the VM or the binary failed
echo "foundation: $passed passed, $failed failed"
[ "$rc" -eq 0 ]
