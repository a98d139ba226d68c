#!/bin/bash
# Stage 2 of the ufab VM test bed: runs inside the guest, as root, chrooted
# into the overlay over the host's /, started by the initramfs's /init.
# run-vm copies this file into the per-run job dir (/run/ufab/job in the
# guest) together with:
#   vm.conf  settings from run-vm (UFAB_VM_* variables, sourced here)
#   env.sh   exports for the command's environment
#   cmd.sh   cd to the caller's directory and exec the command
# Results go back through the same (writable 9p) dir:
#   started  written when the command is about to start (uptime inside)
#   stdout, stderr  the command's output (appended, host streams them live)
#   status   the command's exit status, written last
#   timedout present when the guest-side time bound killed the command
# When this script ends, /init powers the VM off.
set -u

JOB=/run/ufab/job
say() { printf 'ufab-stage2: %s\n' "$*" >/dev/console; }
finish() { # status
  printf '%s\n' "$1" >"$JOB/status.tmp" && mv -f "$JOB/status.tmp" "$JOB/status"
  sync
  exit 0
}

export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root
# shellcheck source=/dev/null
. "$JOB/vm.conf" || { say "cannot read $JOB/vm.conf"; finish 125; }

# Load the kernel drivers of the emulated NICs (there is no udev), then name
# the interfaces by NIC order: NIC N (PCI 00:0(N+1).0) becomes eth(N-1).
nic_ifname() { # pci-dir -> interface name or empty
  local n
  for n in "$1"/net/* "$1"/virtio*/net/*; do
    [[ -e $n ]] && { basename "$n"; return 0; }
  done
  return 1
}
if [[ ${UFAB_VM_NIC_DRIVERS:-1} == 1 && ${UFAB_VM_NIC_COUNT:-0} -gt 0 ]]; then
  for ((i = 1; i <= UFAB_VM_NIC_COUNT; i++)); do
    bdf_var=UFAB_VM_NIC${i}_BDF
    dev=/sys/bus/pci/devices/${!bdf_var}
    [[ -e $dev ]] || { say "warning: NIC $i (${!bdf_var}) not on the PCI bus"; continue; }
    alias=$(<"$dev/modalias")
    if [[ $(<"$dev/vendor") == 0x1af4 ]]; then # virtio: the net driver binds the virtio child
      for v in "$dev"/virtio*; do [[ -e $v/modalias ]] && alias=$(<"$v/modalias"); done
    fi
    timeout 60 modprobe -q -b "$alias" || say "warning: no driver loaded for NIC $i ($alias)"
  done
  names=()
  for ((i = 1; i <= UFAB_VM_NIC_COUNT; i++)); do
    bdf_var=UFAB_VM_NIC${i}_BDF
    dev=/sys/bus/pci/devices/${!bdf_var}
    name=
    for _ in $(seq 100); do # probe is synchronous; this is only a safety net (10 s)
      name=$(nic_ifname "$dev") && break
      sleep 0.1
    done
    names+=("$name")
    [[ -n $name ]] || say "warning: NIC $i (${!bdf_var}) has no network interface"
  done
  # Two passes so that swapping names never collides; skipped when the
  # kernel already named them in NIC order.
  inorder=1
  for ((i = 1; i <= UFAB_VM_NIC_COUNT; i++)); do
    [[ ${names[i-1]} == "eth$((i - 1))" ]] || inorder=0
  done
  ((inorder)) || for ((i = 1; i <= UFAB_VM_NIC_COUNT; i++)); do
    [[ -n ${names[i-1]} ]] && ip link set dev "${names[i-1]}" name "ufabtmp$i" 2>/dev/null &&
      names[i-1]=ufabtmp$i
  done
  ((inorder)) || for ((i = 1; i <= UFAB_VM_NIC_COUNT; i++)); do
    [[ -n ${names[i-1]} ]] || continue
    ip link set dev "${names[i-1]}" name "eth$((i - 1))" ||
      say "warning: could not rename ${names[i-1]} to eth$((i - 1))"
  done
fi

# An NVDIMM (run-vm --nvdimm): its drivers (no udev loads them): nfit reads
# the ACPI NFIT and brings libnvdimm, nd_pmem serves pmem namespaces,
# dax_pmem devdax ones (with device_dax). Then wait for region0 (bounded).
if [[ ${UFAB_VM_NVDIMM_MB:-0} != 0 ]]; then
  for m in nfit nd_pmem device_dax dax_pmem; do
    timeout 60 modprobe -q "$m" || say "warning: modprobe $m failed (--nvdimm)"
  done
  for _ in $(seq 100); do
    [[ -e /sys/bus/nd/devices/region0 ]] && break
    sleep 0.1
  done
  [[ -e /sys/bus/nd/devices/region0 ]] || say "warning: --nvdimm given, but no NVDIMM region (region0) after 10 s"
fi

# The caller's environment (UFAB_*, PATH, ...), then the VM's own facts.
# shellcheck source=/dev/null
. "$JOB/env.sh" || { say "cannot read $JOB/env.sh"; finish 125; }

# Disks (run-vm --disk): load virtio_blk (there is no udev), then tell the
# command which /dev/vdX each one became: UFAB_VM_DISK<N>, found through the
# PCI address, so the order never depends on probe order.
if [[ ${UFAB_VM_DISK_COUNT:-0} -gt 0 ]]; then
  timeout 60 modprobe -q virtio_blk || say "warning: could not load virtio_blk"
  for ((i = 1; i <= UFAB_VM_DISK_COUNT; i++)); do
    bdf_var=UFAB_VM_DISK${i}_BDF
    name=
    for _ in $(seq 100); do # probe is synchronous; a safety net (10 s)
      for b in "/sys/bus/pci/devices/${!bdf_var}"/virtio*/block/*; do
        [[ -e $b && -e /dev/${b##*/} ]] && { name=${b##*/}; break; }
      done
      [[ -n $name ]] && break
      sleep 0.1
    done
    if [[ -n $name ]]; then
      export "UFAB_VM_DISK$i=/dev/$name"
    else
      say "warning: disk $i (${!bdf_var}) has no block device"
    fi
  done
fi

# Time bound: what is left of run-vm's deadline (guest and host clocks agree
# to about a second; the RTC is the host's), less a margin for a SIGTERM
# that is ignored (SIGKILL 5 s later) and the power-off.
now=$(date +%s)
left=$((UFAB_VM_DEADLINE - now - 10))
((left > UFAB_VM_TIMEOUT)) && left=$UFAB_VM_TIMEOUT
((left < 1)) && left=1

read -r up _ </proc/uptime
printf '%s\n' "$up" >"$JOB/started.tmp" && mv -f "$JOB/started.tmp" "$JOB/started"

start=$(date +%s)
if [[ ${UFAB_VM_INTERACTIVE:-0} == 1 ]]; then
  stty -F /dev/ttyS0 sane 2>/dev/null
  if [[ -n ${UFAB_VM_TTY_ROWS:-} ]]; then
    stty -F /dev/ttyS0 rows "$UFAB_VM_TTY_ROWS" cols "${UFAB_VM_TTY_COLS:-80}" 2>/dev/null
  fi
  setsid -w -c timeout --foreground -k 5 "$left" /bin/bash "$JOB/cmd.sh" \
    </dev/ttyS0 >/dev/ttyS0 2>&1
  rc=$?
else
  timeout -k 5 "$left" /bin/bash "$JOB/cmd.sh" </dev/null >>"$JOB/stdout" 2>>"$JOB/stderr"
  rc=$?
fi
elapsed=$(($(date +%s) - start))
# 124 or 137 from the command itself (an inner `timeout`) is passed on as is.
if (((rc == 124 || rc == 137) && elapsed >= left)); then
  printf '%s\n' "$left" >"$JOB/timedout"
fi
finish "$rc"
