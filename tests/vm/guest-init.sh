#!/bin/busybox sh
# /init of the ufab VM test bed's initramfs (busybox ash, PID 1).
# Built into the initramfs by build-initramfs.sh; not run on the host.
#
# Turns the host's / (9p tag "host", read-only) into a writable root with an
# overlay on tmpfs, mounts the unpacked kernel's modules (tag "mods") on
# /lib/modules and the per-run job dir (tag "job", writable) on
# /run/ufab/job, chroots, and runs /run/ufab/job/stage2.sh (written by
# run-vm) with the host's bash.  Whatever happens, it ends with a power-off,
# so QEMU exits.
# shellcheck shell=dash

/bin/busybox --install -s /bin
export PATH=/bin
umask 022

mount -t devtmpfs devtmpfs /dev 2>/dev/null
exec </dev/console >/dev/console 2>&1
mount -t proc proc /proc
mount -t sysfs sysfs /sys

say() { echo "ufab-init: $*"; }
poweroff_now() {
  sync
  if [ -w /proc/sysrq-trigger ]; then echo o >/proc/sysrq-trigger
  elif [ -w /newroot/proc/sysrq-trigger ]; then echo o >/newroot/proc/sysrq-trigger
  fi
  # sysrq-o is asynchronous: give it time; if it never happens PID 1 exits,
  # the kernel panics and panic=-1 plus QEMU's -no-reboot end the VM.
  sleep 30
  exit 1
}
fail() {
  say "FATAL: $*"
  # run-vm looks for this marker on the console to report a boot failure.
  echo "UFAB-VM-BOOT-FAILED"
  poweroff_now
}

# Modules for virtio, 9p and overlay, in dependency order (list made by
# build-initramfs.sh with modprobe --show-depends; built-in ones skipped).
while read -r mod; do
  [ -n "$mod" ] || continue
  insmod "/modules/$mod" || fail "insmod $mod failed"
done </modules/load-order

NINEP=trans=virtio,version=9p2000.L,msize=512000
# Cache mode of the read-only shares (host root, modules); the job share is
# always uncached.  Kernel argument ufab.9pcache=MODE overrides it.
ROCACHE=loose
read -r cmdline </proc/cmdline
for arg in $cmdline; do
  case $arg in ufab.9pcache=*) ROCACHE=${arg#ufab.9pcache=} ;; esac
done
mkdir -p /host /rw /newroot
mount -t 9p -o "$NINEP,ro,cache=$ROCACHE" host /host || fail "mounting the host root (9p tag host) failed"
mount -t tmpfs -o mode=0755 tmpfs /rw || fail "tmpfs for the overlay failed"
mkdir -p /rw/upper /rw/work
mount -t overlay -o lowerdir=/host,upperdir=/rw/upper,workdir=/rw/work overlay /newroot ||
  fail "overlay over the host root failed"

# /lib may be a symlink (merged /usr): mount where it really points.
moddir=/newroot/lib/modules
if [ -L /newroot/lib ]; then
  t=$(readlink /newroot/lib)
  case $t in
    /*) moddir=/newroot$t/modules ;;
    *) moddir=/newroot/$t/modules ;;
  esac
fi
mkdir -p "$moddir"
mount -t 9p -o "$NINEP,ro,cache=$ROCACHE" mods "$moddir" || fail "mounting kernel modules (9p tag mods) failed"

mount -t tmpfs -o mode=1777 tmpfs /newroot/tmp || fail "tmpfs on /tmp failed"
mount -t tmpfs -o mode=0755 tmpfs /newroot/run || fail "tmpfs on /run failed"
mkdir -p /newroot/run/ufab/job
mount -t 9p -o "$NINEP,rw" job /newroot/run/ufab/job || fail "mounting the job dir (9p tag job) failed"

mount --move /dev /newroot/dev || fail "moving /dev failed"
mount --move /proc /newroot/proc || fail "moving /proc failed"
mount --move /sys /newroot/sys || fail "moving /sys failed"
mkdir -p /newroot/dev/pts /newroot/dev/shm /newroot/dev/hugepages
mount -t devpts -o gid=5,mode=620,ptmxmode=666 devpts /newroot/dev/pts
mount -t tmpfs -o mode=1777 tmpfs /newroot/dev/shm
mount -t hugetlbfs hugetlbfs /newroot/dev/hugepages 2>/dev/null

hostname ufab-vm
ip link set lo up || say "warning: could not bring lo up"

[ -f /newroot/run/ufab/job/stage2.sh ] || fail "no stage2.sh in the job dir"
[ -x /newroot/bin/bash ] || fail "the host root has no /bin/bash"
chroot /newroot /bin/bash /run/ufab/job/stage2.sh
say "stage 2 ended with status $?; powering off"
poweroff_now
