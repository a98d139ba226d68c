#!/usr/bin/env bash
# Installs what ufab needs on Debian 12, only what is missing: Debian
# packages, bookworm-backports (for QEMU 10 with igb, and the 6.12 kernel
# the VM test bed boots). A second run finds everything and downloads nothing.
set -euo pipefail

log() { printf 'setup: %s\n' "$*"; }
die() { printf 'setup: error: %s\n' "$*" >&2; exit 1; }

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || die "not root and no sudo: run as root, or install sudo"
  SUDO="sudo"
fi

[ -r /etc/os-release ] && . /etc/os-release
if [ "${VERSION_CODENAME:-}" != "bookworm" ]; then
  log "warning: this is ${PRETTY_NAME:-an unknown system}, not Debian 12 (bookworm); continuing"
fi

PACKAGES=(
  bazel-bootstrap bazel-rules-java g++ libgtest-dev libpci-dev libibverbs-dev pci.ids pciutils
  busybox-static cpio kmod xz-utils zstd jq iproute2 util-linux rdma-core ibverbs-providers ibverbs-utils
  clang-16 libclang-rt-16-dev
  tshark perftest ucx-utils pkgconf
  rdmacm-utils librdmacm-dev
  ndctl daxctl debootstrap
  libfabric-dev libfabric-bin libopenmpi-dev openmpi-bin hpcc
)

missing=()
for p in "${PACKAGES[@]}"; do
  if [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" != "install ok installed" ]; then
    missing+=("$p")
  fi
done

# QEMU: prefer 10.x from bookworm-backports (it adds the igb model).
qemu_major=0
if command -v qemu-system-x86_64 >/dev/null; then
  qemu_major=$(qemu-system-x86_64 --version | sed -n 's/.*version \([0-9]*\)\..*/\1/p' | head -n1)
fi

backports_file=/etc/apt/sources.list.d/ufab-backports.sources
have_backports() { grep -rqs 'bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/; }

add_backports() {
  have_backports && return 0
  # Same mirror as the system's bookworm entry.
  local uri
  uri=$(grep -rhs '^URIs:' /etc/apt/sources.list.d/*.sources | head -n1 | awk '{print $2}')
  [ -n "$uri" ] || uri=$(awk '$1=="deb" && $3=="bookworm" {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
  [ -n "$uri" ] || uri="http://deb.debian.org/debian"
  log "adding bookworm-backports ($uri) in $backports_file"
  printf 'Types: deb\nURIs: %s\nSuites: bookworm-backports\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
    "$uri" | $SUDO tee "$backports_file" >/dev/null
  return 1  # lists must be refreshed
}

need_update=0
if [ "${VERSION_CODENAME:-}" = "bookworm" ]; then
  add_backports || need_update=1
fi
if [ "${#missing[@]}" -gt 0 ] || [ "${qemu_major:-0}" -lt 10 ]; then
  need_update=1
fi

if [ "$need_update" -eq 1 ]; then
  log "refreshing package lists"
  $SUDO apt-get update -q || die "apt-get update failed: check the network and /etc/apt/sources.list.d/"
fi
if [ "${#missing[@]}" -gt 0 ]; then
  # tshark (dissects the interop suite's capture) pulls in wireshark-common,
  # whose debconf question (dumpcap setuid for non-root capture) would
  # otherwise prompt: answer it no beforehand.
  if [[ " ${missing[*]} " == *" tshark "* ]]; then
    echo 'wireshark-common wireshark-common/install-setuid boolean false' | $SUDO debconf-set-selections ||
      die "debconf-set-selections failed"
  fi
  log "installing: ${missing[*]}"
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" ||
    die "apt-get install failed for: ${missing[*]}"
fi
if [ "${qemu_major:-0}" -lt 10 ]; then
  if have_backports; then
    log "installing qemu-system-x86 from bookworm-backports"
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q -t bookworm-backports qemu-system-x86 ||
      die "installing QEMU from bookworm-backports failed"
  elif ! command -v qemu-system-x86_64 >/dev/null; then
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q qemu-system-x86 ||
      die "installing qemu-system-x86 failed"
  fi
fi
log "packages ok ($(qemu-system-x86_64 --version | head -n1))"
