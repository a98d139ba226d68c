#!/bin/bash
# Runs inside the VM (tests/bench/raw_frames.sh). testpmd needs a main and a
# forwarding lcore: both of an instance share one vCPU. For each NIC model and
# frame size: ufab pktgen A -> B, then DPDK testpmd txonly on A and rxonly
# on B, each for $SECONDS_PER_RUN seconds; frames counted at B.
# Prints one "RESULT <json>" line per measurement (the guest's file system is
# a throw-away overlay, so results leave through stdout).
set -euo pipefail
UFAB=${UFAB:?}
SECS=${SECONDS_PER_RUN:-5}

modprobe vfio-pci
for d in 0000:00:02.0 0000:00:03.0 0000:00:04.0 0000:00:05.0; do "$UFAB" bind "$d" >/dev/null; done
echo 512 > /sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages
mkdir -p /dev/hugepages && mount -t hugetlbfs none /dev/hugepages

# Waits (bounded, 1 s steps: every process start is slow under TCG) for a
# line in a log that testpmd is writing.
wait_for_line() {
  local i
  for ((i = 0; i < 240; i++)); do
    grep -aq "$2" "$1" && return 0
    sleep 1
  done
  echo "gave up waiting for '$2' in $1" >&2
}

median() { sort -n | awk '{v[NR]=$1} END {if (NR==0) print 0; else print v[int((NR+1)/2)]}'; }

for model in e1000e virtio; do
  if [ "$model" = e1000e ]; then a=0000:00:02.0; b=0000:00:03.0; else a=0000:00:04.0; b=0000:00:05.0; fi
  for size in 64 1514; do
    echo "== $model, $size-byte frames"
    r=$("$UFAB" pktgen "$a" "$b" --duration "$SECS" --size "$size" --burst 32 --verify header --json || true)
    ufab_fps=$(jq -r '.frames_per_second // 0' <<<"$r")
    echo "ufab:  $(jq -c '{received, lost, out_of_order, corrupt, frames_per_second}' <<<"$r")"

    # DPDK: the receiver first; once it forwards (its first stats line), the
    # sender; then $SECS seconds of the receiver's per-second Rx-pps samples.
    # EAL start-up under TCG takes tens of seconds, hence the long bounds.
    rxlog=$(mktemp) txlog=$(mktemp)
    timeout -s INT 300 dpdk-testpmd --lcores=0@0,1@0 -n 1 -m 64 --file-prefix rx -a "$b" -- \
      --forward-mode=rxonly --rxd=512 --txd=512 --burst=32 --stats-period 1 >"$rxlog" 2>&1 &
    rxpid=$!
    wait_for_line "$rxlog" Rx-pps
    cpu=$(($(nproc) > 1 ? 1 : 0))  # the sender gets the other vCPU when there is one
    timeout -s INT 300 dpdk-testpmd --lcores="0@$cpu,1@$cpu" -n 1 -m 64 --file-prefix tx -a "$a" -- \
      --forward-mode=txonly --txpkts="$size" --rxd=512 --txd=512 --burst=32 --stats-period 1 >"$txlog" 2>&1 &
    txpid=$!
    wait_for_line "$txlog" Tx-pps
    skip=$(grep -ac Rx-pps "$rxlog")
    sleep "$SECS"
    kill -INT "$txpid" 2>/dev/null; wait "$txpid" || true
    kill -INT "$rxpid" 2>/dev/null; wait "$rxpid" || true
    dpdk_fps=$(grep -a -o 'Rx-pps: *[0-9]*' "$rxlog" | tail -n +$((skip + 1)) | head -n "$SECS" | awk '{print $2}' | median)
    dpdk_tx=$(grep -a -o 'Tx-pps: *[0-9]*' "$txlog" | tail -n 3 | head -n 1 | awk '{print $2}')
    echo "dpdk:  ${dpdk_fps:-0} frames/s at B (median of per-second samples), sender at ${dpdk_tx:-0} frames/s"
    if [ "${dpdk_fps:-0}" = 0 ]; then echo "dpdk receiver log:"; grep -a -v '^ *$' "$rxlog" | tail -15; fi
    rm -f "$rxlog" "$txlog"
    printf 'RESULT '
    jq -nc --arg model "$model" --argjson size "$size" --argjson ufab "${ufab_fps:-0}" --argjson dpdk "${dpdk_fps:-0}" \
      '{model: $model, size: $size, ufab_fps: $ufab, dpdk_fps: $dpdk, ratio: (if $dpdk > 0 then $ufab / $dpdk else null end)}'
  done
done
