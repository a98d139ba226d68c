#!/usr/bin/env bash
# Benchmark, not a test: ufab's raw frame rate against DPDK's testpmd on the
# same emulated NIC models in one VM run. Prints a table and writes
# docs/bench/raw_frames.json. Usage: tests/bench/raw_frames.sh [SECONDS_PER_RUN]
set -euo pipefail
cd "$(dirname "$0")/../.."
secs=${1:-5}
scripts/setup.sh
if ! command -v dpdk-testpmd >/dev/null; then
  echo "raw_frames: installing DPDK (dpdk-dev has dpdk-testpmd)"
  apt-get install -y -q dpdk dpdk-dev >/dev/null
fi
bazel build //tools/ufab >/dev/null 2>&1 || { echo "raw_frames: build failed: bazel build //tools/ufab" >&2; exit 1; }
mkdir -p docs/bench
log=$(mktemp)
trap 'rm -f "$log"' EXIT
tests/vm/run-vm --timeout 900 --mem 2048 --smp 2 \
  --nic e1000e --nic e1000e --nic virtio --nic virtio \
  --env UFAB="$PWD/bazel-bin/tools/ufab/ufab" --env SECONDS_PER_RUN="$secs" \
  -- tests/bench/raw_frames_guest.sh | tee "$log"
qemu=$(qemu-system-x86_64 --version | head -n1)
jq -s --arg qemu "$qemu" --arg cmd "tests/bench/raw_frames.sh $secs" --arg date "$(date -u +%F)" \
  '{command: $cmd, date: $date, qemu: $qemu, accel: "tcg", results: .}' \
  <(sed -n 's/^RESULT //p' "$log") >docs/bench/raw_frames.json
printf '\n%-8s %6s %14s %14s %8s\n' model bytes "ufab frames/s" "dpdk frames/s" ratio
jq -r '.results[] | [.model, .size, (.ufab_fps|floor), (.dpdk_fps|floor), (if .ratio then (.ratio*100|round/100) else "n/a" end)] | @tsv' \
  docs/bench/raw_frames.json | while IFS=$'\t' read -r m s u d r; do printf '%-8s %6s %14s %14s %8s\n' "$m" "$s" "$u" "$d" "$r"; done
echo "written: docs/bench/raw_frames.json"
