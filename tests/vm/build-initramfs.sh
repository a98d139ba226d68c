#!/usr/bin/env bash
# Build the ufab VM test bed's initramfs: busybox-static, the kernel modules
# needed to mount 9p and overlay (decompressed, busybox insmod cannot read
# .ko.xz), and guest-init.sh as /init.
#
# Usage: tests/vm/build-initramfs.sh [--quiet] [KERNEL_DIR]
#
#   KERNEL_DIR  an unpacked kernel from fetch-kernel.sh (default: the one
#               fetch-kernel.sh reports, fetching it if needed).
#
# The image is cached as <cache>/initramfs-<kernel version>-<hash>.cpio.gz,
# <hash> covering this script, guest-init.sh, the busybox binary and the
# module files; it is rebuilt only when one of them changes.  Its path is
# the last line printed.  <cache> is ${UFAB_VM_CACHE:-$HOME/.cache/ufab/vm}.
set -euo pipefail

readonly PROG=build-initramfs.sh
HERE=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
CACHE=${UFAB_VM_CACHE:-${HOME:-/root}/.cache/ufab/vm}
QUIET=0
KDIR=

log() { [[ $QUIET == 1 ]] || printf '%s: %s\n' "$PROG" "$*" >&2; }
die() { printf '%s: error: %s\n' "$PROG" "$*" >&2; exit 1; }

while (($#)); do
  case $1 in
    --quiet|-q) QUIET=1; shift ;;
    -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) die "unknown option '$1' (see --help)" ;;
    *) [[ -z $KDIR ]] || die "only one KERNEL_DIR"; KDIR=$1; shift ;;
  esac
done

for tool in cpio gzip modprobe xz sha256sum find timeout flock; do
  command -v "$tool" >/dev/null 2>&1 ||
    die "'$tool' not found (apt-get install cpio gzip kmod xz-utils coreutils util-linux)"
done
BUSYBOX=
for b in /bin/busybox /usr/bin/busybox; do
  # (grep without -q: it must read all input, or pipefail sees SIGPIPE)
  if [[ -x $b ]] && "$b" --list 2>/dev/null | grep -x insmod >/dev/null; then
    BUSYBOX=$b; break
  fi
done
[[ -n $BUSYBOX ]] || die "no busybox with insmod found; apt-get install busybox-static"
if ldd "$BUSYBOX" >/dev/null 2>&1; then
  die "$BUSYBOX is dynamically linked; the initramfs needs busybox-static (apt-get install busybox-static)"
fi

if [[ -z $KDIR ]]; then
  qflag=()
  [[ $QUIET == 1 ]] && qflag=(--quiet)
  KDIR=$("$HERE/fetch-kernel.sh" "${qflag[@]}" | tail -n1) || die "fetch-kernel.sh failed"
fi
[[ -f $KDIR/.ufab-complete ]] || die "$KDIR is not a kernel dir made by fetch-kernel.sh"
KVER=$(<"$KDIR/.ufab-complete")

# Modules in load order: the dependency closure reported by modprobe, each
# once; built-in ones ("builtin X") are skipped.  virtio_pci is built in on
# 6.12 and a module on 6.1.
WANT=(virtio_pci 9pnet_virtio 9p overlay)
mods=()
declare -A seen=()
for m in "${WANT[@]}"; do
  out=$(timeout 60 modprobe -d "$KDIR" -S "$KVER" --show-depends "$m" 2>&1) ||
    die "modprobe --show-depends $m failed for $KVER: $out"
  while read -r kind path _; do
    [[ $kind == insmod ]] || continue
    [[ -n ${seen[$path]:-} ]] && continue
    seen[$path]=1
    mods+=("$path")
  done <<<"$out"
done
((${#mods[@]} > 0)) || log "all needed modules are built into $KVER"

# Content hashes only (sha256sum prints file names too; cut them off so the
# hash does not depend on how this script was called).
hash=$( {
  for f in "${BASH_SOURCE[0]}" "$HERE/guest-init.sh" "$BUSYBOX" "${mods[@]}"; do
    sha256sum <"$f" | cut -c1-64
  done
  printf '%s\n' "$KVER"
} | sha256sum | cut -c1-16)
OUT=$CACHE/initramfs-$KVER-$hash.cpio.gz

if [[ -s $OUT ]]; then
  log "initramfs up to date: $OUT"
  printf '%s\n' "$OUT"
  exit 0
fi

mkdir -p "$CACHE"
exec 9>"$CACHE/.initramfs.lock"
flock -w 300 9 || die "another build holds $CACHE/.initramfs.lock for over 5 min"
if [[ -s $OUT ]]; then # built by a concurrent run meanwhile
  printf '%s\n' "$OUT"
  exit 0
fi

log "building initramfs for $KVER (${#mods[@]} modules)"
stage=$(mktemp -d "${TMPDIR:-/tmp}/ufab-initramfs.XXXXXX")
trap 'rm -rf -- "$stage"' EXIT
mkdir -p "$stage"/{bin,dev,proc,sys,modules,tmp}
cp "$BUSYBOX" "$stage/bin/busybox"
install -m 0755 "$HERE/guest-init.sh" "$stage/init"
mknod -m 600 "$stage/dev/console" c 5 1 2>/dev/null || true
: >"$stage/modules/load-order"
for p in "${mods[@]}"; do
  base=$(basename "$p")
  case $base in
    *.ko.xz) xz -dc "$p" >"$stage/modules/${base%.xz}"; base=${base%.xz} ;;
    *.ko.zst) command -v zstd >/dev/null || die "$p needs zstd (apt-get install zstd)"
              zstd -qdc "$p" >"$stage/modules/${base%.zst}"; base=${base%.zst} ;;
    *.ko.gz) gzip -dc "$p" >"$stage/modules/${base%.gz}"; base=${base%.gz} ;;
    *.ko) cp "$p" "$stage/modules/$base" ;;
    *) die "unexpected module file $p" ;;
  esac
  printf '%s\n' "$base" >>"$stage/modules/load-order"
  log "  module $base"
done

tmp_out=$OUT.tmp.$$
(cd "$stage" && find . -print0 | LC_ALL=C sort -z |
  timeout 120 cpio --null -o -H newc --owner=0:0 --quiet) | gzip -1 >"$tmp_out" ||
  { rm -f "$tmp_out"; die "cpio/gzip failed writing $tmp_out"; }
mv -f "$tmp_out" "$OUT"
# Drop older images of this kernel made from other inputs.
# (not the fresh ones: a run started a moment ago may not have loaded its image yet)
find "$CACHE" -maxdepth 1 -name "initramfs-$KVER-*.cpio.gz" ! -name "$(basename "$OUT")" -mmin +10 -delete
log "initramfs ready: $OUT ($(du -h "$OUT" | cut -f1))"
printf '%s\n' "$OUT"
