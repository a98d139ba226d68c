#!/usr/bin/env bash
# VM suite for the RDMA API: one VM with an e1000e (00:02.0) and a
# virtio-net (00:03.0) on one hub, both bound to vfio-pci, opened as RDMA
# devices 10.0.0.1 and 10.0.0.2 in one process (tests/vm/cases/rdma_vm_test):
# RC WRITE, READ, SEND/RECV with and without immediate, WRITE_WITH_IMM and
# atomics both ways, up to 1 MiB, every byte checked.
# Needs `bazel build //tools/ufab //tests/vm/cases:rdma_vm_test` (scripts/test.sh
# builds //...). Ends with "rdma: N passed, M failed".
set -uo pipefail
cd "$(dirname "$0")/../../.."
bin=$PWD/bazel-bin
out=$(mktemp)
trap 'rm -f "$out"' EXIT

guest=$(cat <<GUEST
modprobe vfio-pci || exit 1
for d in 0000:00:02.0 0000:00:03.0; do $bin/tools/ufab/ufab bind \$d >/dev/null || exit 1; done
$bin/tests/vm/cases/rdma_vm_test
GUEST
)
tests/vm/run-vm --timeout 1200 --mem 2048 --nic e1000e --nic virtio \
  --env UFAB_RDMA_PORTS=0000:00:02.0,0000:00:03.0 \
  -- sh -c "$guest" 2>&1 | tee "$out"
rc=${PIPESTATUS[0]}

passed=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$out" | tail -n1)
failed=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' "$out" | tail -n1)
passed=${passed:-0}; failed=${failed:-0}
if [ "$rc" -ne 0 ] && [ "$failed" -eq 0 ]; then failed=1; fi  # the VM or the binary failed
echo "rdma: $passed passed, $failed failed"
[ "$rc" -eq 0 ]
