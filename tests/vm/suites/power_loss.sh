#!/usr/bin/env bash
# VM suite for power-loss durability (issue 13, docs/persistence.md): three
# kills of tests/bench/power_loss.sh. Each boots a VM with a virtio-blk disk
# backed by a fresh host image, a ufab target registering the disk's
# MAP_SHARED mapping as durable memory and a ufab initiator writing committed
# (WRITE + FLUSH PERSISTENT) and control (WRITE + FLUSH GLOBAL) blocks into it
# over swnic; QEMU is killed with SIGKILL at a random point; the host then
# checks the image: every committed block there byte for byte, and not every
# control block (else the kill proved nothing). One case per kill.
# Needs `bazel build //tests/vm/cases:power_loss` (the script builds it).
# About 15 to 30 s per kill under TCG. Ends with "power_loss: N passed, M failed".
set -uo pipefail
cd "$(dirname "$0")/../../.." || exit 1
out=$(mktemp)
trap 'rm -f "$out"' EXIT

tests/bench/power_loss.sh --kills "${UFAB_POWER_LOSS_KILLS:-3}" 2>&1 | tee "$out"
rc=${PIPESTATUS[0]}
kills=$(sed -n 's/^power_loss: kills \([0-9]*\),.*/\1/p' "$out" | tail -n1)
failed=$(sed -n 's/^power_loss: kills .*, failed \([0-9]*\)$/\1/p' "$out" | tail -n1)
kills=${kills:-0}; failed=${failed:-0}
if [ "$rc" -ne 0 ] && [ "$failed" -eq 0 ]; then failed=1; fi  # the harness itself failed
passed=$((kills - failed)); [ "$passed" -ge 0 ] || passed=0
echo "power_loss: $passed passed, $failed failed"
[ "$rc" -eq 0 ]
