# Sourced by VM suites (drivers, stress) that need virtio-net NICs with two
# queue pairs. QEMU gives virtio-net as many pairs as its backend has
# queues, and the hub has one, so each such NIC sits on a multi-queue tap
# (queues=2, mq=on), the two taps bridged inside a private network
# namespace (unshare -n): nothing touches the host's network. After the VM
# the namespace's shell prints how many frames each tap queue handed to
# the guest (tap queue i feeds the NIC's RX queue i) as
# "SUITE: tap TAP queue Q delivered N frames".

# vm_kernel_ready SUITE: the kernel and initramfs, fetched and built outside
# the namespace (a first fetch downloads the kernel; the namespace has no
# network). On failure prints the suite's summary line and returns 1.
vm_kernel_ready() {
  local kdir
  kdir=$(tests/vm/fetch-kernel.sh --quiet | tail -n1) && tests/vm/build-initramfs.sh --quiet "$kdir" >/dev/null && return 0
  echo "$1: could not prepare the VM kernel (see above)"
  echo "$1: 0 passed, 1 failed"
  return 1
}

# mq_taps SUITE NAME MAC5: sets mq_wrap (the command prefix that runs
# run-vm in the namespace), mq_args (run-vm's QEMU arguments for two
# virtio-net NICs at 00:0a.0 and 00:0b.0, MACs 52:54:00:00:MAC5:0i) and
# mq_bdfs; all empty, and returns 1, where no namespace with taps can be
# made (needs root, unshare, ip, tc, /dev/net/tun).
mq_taps() {
  local suite=$1 name=$2 mac5=$3 i
  mq_wrap=() mq_args=() mq_bdfs=
  [ -c /dev/net/tun ] && command -v unshare >/dev/null && command -v ip >/dev/null && command -v tc >/dev/null &&
    unshare -n true 2>/dev/null || return 1
  mq_wrap=(unshare -n sh -c 'set -e
    suite=$1 name=$2; shift 2
    ip link add ${name}br type bridge
    for t in ${name}0 ${name}1; do
      ip tuntap add dev $t mode tap multi_queue
      ip link set $t master ${name}br
      ip link set $t up
    done
    ip link set ${name}br up
    set +e
    "$@"
    rc=$?
    for t in ${name}0 ${name}1; do
      for q in 0 1; do
        n=$(tc -s class show dev $t classid :$((q + 1)) | sed -n "s/.*Sent [0-9]* bytes \([0-9]*\) pkt.*/\1/p")
        echo "$suite: tap $t queue $q delivered ${n:-0} frames"
      done
    done
    exit $rc' taps "$suite" "$name")
  for i in 0 1; do
    mq_args+=(--qemu-arg -netdev --qemu-arg "tap,id=${name}$i,ifname=${name}$i,script=no,downscript=no,vhost=off,queues=2"
              --qemu-arg -device
              --qemu-arg "virtio-net-pci,disable-legacy=on,iommu_platform=on,mq=on,vectors=6,netdev=${name}$i,mac=52:54:00:00:$mac5:0$i,bus=pcie.0,addr=0x$(printf "%x" $((10 + i))),romfile=")
  done
  mq_bdfs="0000:00:0a.0 0000:00:0b.0"
}
