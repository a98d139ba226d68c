#!/usr/bin/env bash
# Self-test of the ufab VM test bed: ONE VM boot with an e1000e and a
# virtio-net NIC, a small script inside, and checks on both sides:
#   - run-vm returns the command's exit status (the guest part exits 3)
#   - stdout and stderr come back separately; cwd and UFAB_* env are passed
#   - the guest sees both NICs with the MACs given, named eth0/eth1 in order
#   - the IOMMU is on: /sys/kernel/iommu_groups is populated, both NICs are
#     in a group, virtio-net negotiated VIRTIO_F_ACCESS_PLATFORM
#   - the NICs share the hub: eth0 pings eth1 (in a network namespace) and
#     the --pcap file holds those frames
#   - modprobe vfio-pci works, and binding the e1000e to vfio-pci through
#     driver_override + unbind + drivers_probe creates /dev/vfio/<group>
#   - --disk: the guest finds the disk as UFAB_VM_DISK1, reads what the host
#     put in the image, and what it writes (fsync'd) is in the image after
# Prints PASS/FAIL per check; exits 0 only if all pass.
#
# Usage: tests/vm/selftest.sh [--verbose]
set -euo pipefail

HERE=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
MAC1=52:54:00:00:00:01 # the default of NIC 1
MAC2=52:54:00:5e:1f:02 # given explicitly, to test MODEL:MAC
GUEST_STATUS=3
GUEST_CHECKS=18

# ----------------------------------------------------------- guest side
if [[ ${1:-} == --guest ]]; then
  set +e
  pass() { printf 'PASS guest: %s\n' "$*"; }
  fail() { printf 'FAIL guest: %s\n' "$*"; }
  verdict() { # status pass-text fail-text
    if [[ $1 == 0 ]]; then pass "$2"; else fail "$3"; fi
  }
  echo "selftest-stderr-line" >&2

  [[ $(pwd -P) == "$UFAB_SELFTEST_CWD" ]]
  verdict $? "cwd is the caller's ($UFAB_SELFTEST_CWD)" "cwd is $(pwd -P), expected $UFAB_SELFTEST_CWD"
  [[ ${UFAB_SELFTEST_TOKEN:-} == "$UFAB_SELFTEST_EXPECT" ]]
  verdict $? "UFAB_* environment passed through" "UFAB_SELFTEST_TOKEN='${UFAB_SELFTEST_TOKEN:-}'"
  [[ $(id -u) == 0 ]]
  verdict $? "runs as root" "runs as uid $(id -u)"

  # NICs and MACs.
  macs=$(cat /sys/class/net/*/address 2>/dev/null | sort | tr '\n' ' ')
  for m in "$UFAB_SELFTEST_MAC1" "$UFAB_SELFTEST_MAC2"; do
    grep -qw "$m" <<<"$macs"
    verdict $? "a NIC has MAC $m" "no NIC with MAC $m (seen: $macs)"
  done
  a0=$(cat /sys/class/net/eth0/address 2>/dev/null)
  a1=$(cat /sys/class/net/eth1/address 2>/dev/null)
  [[ $a0 == "$UFAB_SELFTEST_MAC1" && $a1 == "$UFAB_SELFTEST_MAC2" ]]
  verdict $? "eth0/eth1 are NIC 1/NIC 2 ($a0 $a1)" "eth0/eth1 have MACs '$a0' '$a1'"
  e1000e=/sys/bus/pci/devices/$UFAB_VM_NIC1_BDF
  virtio=/sys/bus/pci/devices/$UFAB_VM_NIC2_BDF
  id1=$(cat "$e1000e/vendor" "$e1000e/device" 2>/dev/null | tr '\n' ' ')
  [[ $id1 == "0x8086 0x10d3 " ]]
  verdict $? "NIC 1 at $UFAB_VM_NIC1_BDF is an e1000e (8086:10d3)" "NIC 1 at $UFAB_VM_NIC1_BDF is '$id1'"
  id2=$(cat "$virtio/vendor" "$virtio/device" 2>/dev/null | tr '\n' ' ')
  [[ $id2 == "0x1af4 0x1041 " ]]
  verdict $? "NIC 2 at $UFAB_VM_NIC2_BDF is a modern virtio-net (1af4:1041)" "NIC 2 at $UFAB_VM_NIC2_BDF is '$id2'"

  # IOMMU.
  ngroups=$(find /sys/kernel/iommu_groups -mindepth 1 -maxdepth 1 2>/dev/null | wc -l)
  ((ngroups > 0))
  verdict $? "/sys/kernel/iommu_groups has $ngroups groups (IOMMU on)" "/sys/kernel/iommu_groups is empty (IOMMU off?)"
  [[ -e $e1000e/iommu_group && -e $virtio/iommu_group ]]
  verdict $? "both NICs are in an IOMMU group" "a NIC has no IOMMU group"
  feat=$(cat "$virtio"/virtio*/features 2>/dev/null)
  [[ ${feat:33:1} == 1 ]]
  verdict $? "virtio-net negotiated ACCESS_PLATFORM (its DMA goes through the IOMMU)" \
    "virtio-net features '$feat' lack bit 33 (ACCESS_PLATFORM)"

  # The hub: eth1 into a namespace, ping across.
  ip netns add peer && ip link set eth1 netns peer &&
    ip addr add 10.99.0.1/24 dev eth0 && ip link set eth0 up &&
    ip -n peer addr add 10.99.0.2/24 dev eth1 && ip -n peer link set eth1 up
  ok=1
  for _ in 1 2 3 4 5 6 7 8; do # the emulated links need a moment to come up
    if timeout 5 busybox ping -c 1 -W 2 10.99.0.2 >/dev/null 2>&1; then ok=0; break; fi
    sleep 0.5
  done
  verdict $ok "eth0 pings eth1 across the QEMU hub" "no ping reply across the hub"
  ip link set eth0 down

  # vfio-pci: the bind recipe end to end.
  timeout 60 modprobe vfio-pci
  verdict $? "modprobe vfio-pci" "modprobe vfio-pci failed"
  bdf=$UFAB_VM_NIC1_BDF
  group=$(basename "$(readlink "$e1000e/iommu_group")")
  echo vfio-pci >"$e1000e/driver_override"
  if [[ -e $e1000e/driver ]]; then echo "$bdf" >"$e1000e/driver/unbind"; fi
  echo "$bdf" >/sys/bus/pci/drivers_probe
  drv=$(basename "$(readlink "$e1000e/driver" 2>/dev/null)" 2>/dev/null)
  [[ $drv == vfio-pci ]]
  verdict $? "e1000e $bdf bound to vfio-pci" "e1000e $bdf driver is '$drv', not vfio-pci"
  [[ -c /dev/vfio/$group ]]
  verdict $? "/dev/vfio/$group exists (IOMMU group of the e1000e)" \
    "/dev/vfio/$group missing (have: $(find /dev/vfio -mindepth 1 -printf '%f ' 2>/dev/null))"
  exec 3<>"/dev/vfio/$group"
  verdict $? "/dev/vfio/$group opens" "cannot open /dev/vfio/$group"
  exec 3>&-

  # --disk: a block device, the host's marker in block 0; write block 1.
  [[ -b ${UFAB_VM_DISK1:-} ]]
  verdict $? "--disk is block device ${UFAB_VM_DISK1:-} (UFAB_VM_DISK1)" "UFAB_VM_DISK1='${UFAB_VM_DISK1:-}' is not a block device"
  got=$(dd if="${UFAB_VM_DISK1:-/dev/null}" bs=4096 count=1 status=none 2>/dev/null | tr -d '\0')
  [[ $got == "host-$UFAB_SELFTEST_TOKEN" ]] &&
    printf 'guest-%s' "$UFAB_SELFTEST_TOKEN" | dd of="$UFAB_VM_DISK1" bs=4096 seek=1 conv=sync,fsync status=none
  verdict $? "the disk holds the host's marker; wrote ours to block 1" "read '$got' from the disk, or the write failed"
  exit "$GUEST_STATUS"
fi

# ------------------------------------------------------------ host side
RUNVM_OPTS=()
if [[ ${1:-} == --verbose ]]; then RUNVM_OPTS+=(--verbose); fi
work=$(mktemp -d "${TMPDIR:-/tmp}/ufab-selftest.XXXXXX")
trap 'rm -rf -- "$work"' EXIT
token=$RANDOM$RANDOM
truncate -s 1M "$work/disk.img"
printf 'host-%s' "$token" | dd of="$work/disk.img" conv=notrunc status=none
fails=0
pass() { printf 'PASS host:  %s\n' "$*"; }
fail() { printf 'FAIL host:  %s\n' "$*"; fails=$((fails + 1)); }

cd "$HERE/../.." # a directory the guest can see (its /tmp is its own)
start=$(date +%s)
rc=0
UFAB_SELFTEST_TOKEN=$token UFAB_SELFTEST_EXPECT=$token UFAB_SELFTEST_CWD=$(pwd -P) \
  UFAB_SELFTEST_MAC1=$MAC1 UFAB_SELFTEST_MAC2=$MAC2 \
  timeout 400 "$HERE/run-vm" "${RUNVM_OPTS[@]}" --timeout 300 \
  --nic e1000e --nic "virtio:$MAC2" --pcap "$work/hub.pcap" --disk "$work/disk.img" \
  -- bash "$HERE/selftest.sh" --guest >"$work/out" 2>"$work/err" || rc=$?
took=$(($(date +%s) - start))

grep -E '^(PASS|FAIL) ' "$work/out" || true
guest_fails=$(grep -c '^FAIL guest' "$work/out" || true)
fails=$((fails + guest_fails))
nguest=$(grep -cE '^(PASS|FAIL) guest' "$work/out" || true)
if ((nguest == GUEST_CHECKS)); then
  pass "all $GUEST_CHECKS guest checks ran"
else
  fail "$nguest of $GUEST_CHECKS guest checks ran"
fi
if ((rc == GUEST_STATUS)); then
  pass "run-vm returned the command's exit status ($GUEST_STATUS)"
else
  fail "run-vm returned $rc, expected the command's $GUEST_STATUS"
fi
if grep -qx 'selftest-stderr-line' "$work/err" && ! grep -q 'selftest-stderr-line' "$work/out"; then
  pass "the command's stderr came out on run-vm's stderr"
else
  fail "the command's stderr line is not (only) on run-vm's stderr"
fi

# --disk: what the guest wrote is in the image.
disk_block1=$(dd if="$work/disk.img" bs=4096 skip=1 count=1 status=none | tr -d '\0')
if [[ $disk_block1 == "guest-$token" ]]; then
  pass "--disk: the guest's write is in the host's image"
else
  fail "--disk: block 1 of the image holds '$disk_block1', not the guest's 'guest-$token'"
fi

# The pcap: the file starts with the pcap magic and holds frames both ways
# between the two MACs (ICMP echo request and reply).
if [[ -s $work/hub.pcap ]]; then
  hex=$(od -An -tx1 -v "$work/hub.pcap" | tr -d ' \n')
  m1=${MAC1//:/}
  m2=${MAC2//:/}
  if [[ ${hex:0:8} == d4c3b2a1 ]]; then
    pass "--pcap wrote a pcap file ($(stat -c %s "$work/hub.pcap") bytes)"
  else
    fail "--pcap file does not start with the pcap magic"
  fi
  if [[ $hex == *"$m2$m1"* && $hex == *"$m1$m2"* ]]; then
    pass "--pcap holds frames in both directions between the NICs"
  else
    fail "--pcap lacks frames between $MAC1 and $MAC2"
  fi
else
  fail "--pcap file missing or empty"
fi

if ((fails > 0)); then
  echo "---- run-vm stdout (other lines):"
  grep -vE '^(PASS|FAIL) ' "$work/out" || true
  echo "---- run-vm stderr:"
  cat "$work/err"
  echo "selftest: FAILED ($fails failed checks, ${took} s)"
  exit 1
fi
echo "selftest: all checks passed (one VM boot, ${took} s)"
