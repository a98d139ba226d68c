#!/usr/bin/env bash
# The sandbox demo: boots the VM test bed with an e1000e and a virtio-net
# behind an emulated IOMMU, and inside it (scripts/demo-guest.sh) runs ufab
# list, bind and info on the e1000e, RDMA WRITE and SEND between `ufab perf`
# on it (user space, through VFIO) and perftest on the kernel's soft-RoCE
# (rxe0 on the virtio-net), prints what both sides measured, then ufab
# unbind. Exits non-zero, with a line saying what failed, when a step fails.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
echo "== building ufab"
bazel build //tools/ufab 2>&1 | grep -E '^(ERROR|Target)|error:' || true
bazel build //tools/ufab >/dev/null 2>&1 || { echo "demo: build failed (run: bazel build //tools/ufab)" >&2; exit 1; }
echo "== booting the VM (QEMU q35 + intel-iommu under TCG; first run downloads the kernel)"
# Two vCPUs: perftest and ufab perf both busy-poll, and rxe does its work in
# the kernel beside them. The guest bounds each of its steps well within
# --timeout.
rc=0
tests/vm/run-vm --nic e1000e --nic virtio --smp 2 --mem 2048 --timeout 420 \
  -- scripts/demo-guest.sh "$PWD/bazel-bin/tools/ufab/ufab" || rc=$?
case $rc in
  0) ;;
  124) echo "demo: FAILED: the VM ran past its 420 s limit (run-vm's lines above show where it was)" >&2 ;;
  125) echo "demo: FAILED: the VM test bed itself (run-vm exited 125: QEMU, the kernel or the boot; see its lines above)" >&2 ;;
  *) echo "demo: FAILED: the demo in the VM exited with $rc (its 'demo: FAILED' line above says which step)" >&2 ;;
esac
exit "$rc"
