#!/usr/bin/env bash
# The sandbox demo: boots the VM test bed with an e1000e and a virtio-net
# behind an emulated IOMMU, and inside it runs ufab list, bind, info, unbind.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
echo "== building ufab"
bazel build //tools/ufab 2>&1 | grep -E '^(ERROR|Target)|error:' || true
bazel build //tools/ufab >/dev/null 2>&1 || { echo "demo: build failed (run: bazel build //tools/ufab)" >&2; exit 1; }
echo "== booting the VM (QEMU q35 + intel-iommu under TCG; first run downloads the kernel)"
exec tests/vm/run-vm --nic e1000e --nic virtio --timeout 300 -- scripts/demo-guest.sh "$PWD/bazel-bin/tools/ufab/ufab"
