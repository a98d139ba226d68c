#!/usr/bin/env bash
# Zero-copy transmit on an emulated DMA NIC: `ufab perf write-bw` between
# two vfio-bound e1000e of one VM (2 vCPUs, TCG), with the soft-RoCE
# parameter zerocopy=on and zerocopy=off alternating in one boot.
# docs/benchmarks.md has the figures.
#
#   tests/bench/zerocopy_vm.sh          (about 4 minutes)
# Env: ROUNDS (3), SIZES ("1024 65536").
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${ROUNDS:-3}
sizes=${SIZES:-1024 65536}
bazel build //tools/ufab >/dev/null 2>&1 || bazel build //tools/ufab
u=$PWD/bazel-bin/tools/ufab/ufab
guest=$(cat <<GUEST
modprobe vfio-pci || exit 1
$u bind 0000:00:02.0 >/dev/null && $u bind 0000:00:03.0 >/dev/null || exit 1
port=19000
for r in \$(seq 1 $rounds); do for zc in on off; do for s in $sizes; do
  port=\$((port + 1)); n=\$(( s >= 65536 ? 512 : 8192 ))
  taskset -c 0 timeout 120 $u perf write-bw 0000:00:02.0 --ip 10.0.0.1 -s \$s -n \$n -p \$port --timeout 60 \
    --param zerocopy=\$zc >/dev/null 2>&1 &
  sleep 0.5
  line=\$(taskset -c 1 timeout 120 $u perf write-bw 0000:00:03.0 --ip 10.0.0.2 -s \$s -n \$n -p \$port \
    --timeout 60 --param zerocopy=\$zc 127.0.0.1 2>&1 | grep -A1 '#bytes' | tail -1)
  wait
  echo "zerocopy=\$zc round \$r: \$line"
done; done; done
GUEST
)
echo "zerocopy_vm: #bytes #iterations BW-peak BW-average(MiB/s) MsgRate(Mpps), per round"
tests/vm/run-vm --timeout 900 --smp 2 --mem 2048 --nic e1000e --nic e1000e -- sh -c "$guest" 2>&1 | grep '^zerocopy='
