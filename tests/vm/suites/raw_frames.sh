#!/usr/bin/env bash
# VM suite for the driver plugins: e1000e and virtio-net driven from user
# space through VFIO, frames between them and to/from a kernel-driven NIC.
# Ends with "raw_frames: N passed, M failed".
set -uo pipefail
cd "$(dirname "$0")/../../.."
bin=$PWD/bazel-bin
out=$(mktemp)
trap 'rm -f "$out"' EXIT

# NICs 1-2 e1000e (00:02.0, 00:03.0), 3-4 virtio (00:04.0, 00:05.0): bound to
# vfio-pci; NIC 5 e1000e (00:06.0) stays with the kernel's e1000e driver.
guest=$(cat <<GUEST
set -e
modprobe vfio-pci
for d in 0000:00:02.0 0000:00:03.0 0000:00:04.0 0000:00:05.0; do $bin/tools/ufab/ufab bind \$d >/dev/null; done
kif=\$(ls /sys/bus/pci/devices/0000:00:06.0/net)
UFAB_KERNEL_IF=\$kif $bin/tests/vm/cases/raw_frames_vm_test
GUEST
)
tests/vm/run-vm --timeout 1200 --mem 2048 \
  --nic e1000e --nic e1000e --nic virtio --nic virtio --nic e1000e \
  --env UFAB_E1000E=0000:00:02.0,0000:00:03.0 --env UFAB_VIRTIO=0000:00:04.0,0000:00:05.0 \
  -- sh -c "$guest" 2>&1 | tee "$out"
rc=${PIPESTATUS[0]}

passed=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$out" | tail -n1)
failed=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' "$out" | tail -n1)
passed=${passed:-0}; failed=${failed:-0}
if [ "$rc" -ne 0 ] && [ "$failed" -eq 0 ]; then failed=1; fi
echo "raw_frames: $passed passed, $failed failed"
[ "$rc" -eq 0 ]
