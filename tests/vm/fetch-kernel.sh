#!/usr/bin/env bash
# Fetch Debian's amd64 kernel image for the ufab VM test bed, without
# installing it: `apt-get download` the versioned linux-image package,
# unpack it with `dpkg -x` into the cache and run `depmod -b` on the tree.
#
# Usage: tests/vm/fetch-kernel.sh [--suite SUITE] [--refresh] [--quiet]
#
#   --suite SUITE  take linux-image-amd64 from this apt suite
#                  (bookworm-backports or bookworm; env UFAB_VM_KERNEL_SUITE).
#                  Default: bookworm-backports (6.12) when that suite is
#                  configured, else the default candidate (bookworm, 6.1).
#   --refresh      re-resolve the version through apt even if a kernel is
#                  already cached (picks up a newer package after apt update).
#   --quiet        print only the result line.
#
# Cache: ${UFAB_VM_CACHE:-$HOME/.cache/ufab/vm}/kernel-<version>/ holds the
# unpacked package (boot/vmlinuz-<version>, lib/modules/<version>/).  The
# file <cache>/kernel holds the path of the kernel dir in use; it is also the
# last line this script prints.  A later run with no --suite/--refresh reuses
# that dir without asking apt anything and downloads nothing.
set -euo pipefail

readonly PROG=fetch-kernel.sh
CACHE=${UFAB_VM_CACHE:-${HOME:-/root}/.cache/ufab/vm}
SUITE=${UFAB_VM_KERNEL_SUITE:-}
REFRESH=0
QUIET=0

log() { [[ $QUIET == 1 ]] || printf '%s: %s\n' "$PROG" "$*" >&2; }
die() { printf '%s: error: %s\n' "$PROG" "$*" >&2; exit 1; }

while (($#)); do
  case $1 in
    --suite) [[ $# -ge 2 ]] || die "--suite needs a value"; SUITE=$2; shift 2 ;;
    --suite=*) SUITE=${1#--suite=}; shift ;;
    --refresh) REFRESH=1; shift ;;
    --quiet|-q) QUIET=1; shift ;;
    -h|--help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done

for tool in apt-cache apt-get dpkg depmod flock timeout; do
  command -v "$tool" >/dev/null 2>&1 ||
    die "'$tool' not found; this script needs Debian's apt, dpkg, kmod and util-linux"
done

mkdir -p "$CACHE" || die "cannot create cache dir $CACHE (set UFAB_VM_CACHE to a writable place)"
POINTER=$CACHE/kernel

# A kernel dir is complete when the marker written after depmod exists.
kernel_ok() {
  local dir=$1 ver
  [[ -f $dir/.ufab-complete ]] || return 1
  ver=$(<"$dir/.ufab-complete")
  [[ -n $ver && -f $dir/boot/vmlinuz-$ver && -f $dir/lib/modules/$ver/modules.dep ]]
}

finish() {
  local dir=$1
  if [[ $(cat "$POINTER" 2>/dev/null || true) != "$dir" ]]; then
    printf '%s\n' "$dir" >"$POINTER.tmp.$$" && mv -f "$POINTER.tmp.$$" "$POINTER"
  fi
  printf '%s\n' "$dir"
  exit 0
}

# Fast path, no apt at all: the kernel recorded by an earlier run.
if [[ -z $SUITE && $REFRESH == 0 && -f $POINTER ]]; then
  dir=$(<"$POINTER")
  if kernel_ok "$dir"; then
    log "using cached kernel $(<"$dir/.ufab-complete") in $dir"
    finish "$dir"
  fi
fi

# Serialise concurrent fetches (several run-vm calls at once).
exec 9>"$CACHE/.fetch.lock"
flock -w 900 9 || die "another fetch-kernel.sh holds $CACHE/.fetch.lock for over 15 min; remove the lock if stale"

# Choose the suite.
if [[ -z $SUITE ]]; then
  # (grep without -q: it must read all input, or pipefail sees SIGPIPE)
  if timeout 60 apt-cache policy 2>/dev/null | grep 'n=bookworm-backports' >/dev/null; then
    SUITE=bookworm-backports
  else
    SUITE=default
  fi
fi

# Resolve linux-image-amd64 -> linux-image-<version>-amd64 (local apt lists only).
if [[ $SUITE == default || $SUITE == bookworm ]]; then
  deps=$(timeout 60 apt-cache depends linux-image-amd64 2>&1) ||
    die "apt-cache depends linux-image-amd64 failed: $deps
  Run 'apt-get update' (are Debian's package lists present?)"
else
  deps=$(timeout 60 apt-cache depends -t "$SUITE" linux-image-amd64 2>&1) ||
    die "apt-cache depends -t $SUITE linux-image-amd64 failed: $deps
  Is the suite '$SUITE' configured in /etc/apt/sources.list.d/? Run 'apt-get update'."
fi
pkg=$(printf '%s\n' "$deps" | sed -n 's/^ *Depends: \(linux-image-[^ ]*-amd64\)$/\1/p' | head -n1)
[[ -n $pkg ]] || die "could not find the versioned kernel package in 'apt-cache depends' output:
$deps
  Run 'apt-get update' and check that linux-image-amd64 is available."
ver=${pkg#linux-image-}
dir=$CACHE/kernel-$ver
log "suite $SUITE: linux-image-amd64 -> $pkg"

if kernel_ok "$dir"; then
  log "kernel $ver already unpacked in $dir (nothing to download)"
  finish "$dir"
fi

# The tree is unpacked next to its final place (same file system, so the
# final mv is atomic); the .deb goes to a temp dir that apt's unprivileged
# _apt user can write (the cache under /root is not reachable for it).
work=$(mktemp -d "$CACHE/.fetch.XXXXXX")
dl=$(mktemp -d "${TMPDIR:-/tmp}/ufab-kernel-deb.XXXXXX")
trap 'rm -rf -- "$work" "$dl"' EXIT
if id _apt >/dev/null 2>&1; then chown _apt "$dl" 2>/dev/null || true; fi

log "downloading $pkg (70 to 110 MB; not installed) into $dl"
target=()
[[ $SUITE == default || $SUITE == bookworm ]] || target=(-t "$SUITE")
if ! (cd "$dl" && timeout 900 apt-get download -q "${target[@]}" "$pkg" >&2); then
  die "apt-get download $pkg failed (network or apt sources).
  Check 'apt-get update' works, or pick another suite with --suite bookworm."
fi
deb=$(find "$dl" -maxdepth 1 -name "${pkg}_*.deb" -print -quit)
[[ -n $deb ]] || die "apt-get download reported success but no ${pkg}_*.deb is in $dl"

log "unpacking $(basename "$deb")"
timeout 600 dpkg -x "$deb" "$work/tree" || die "dpkg -x $deb failed (disk full?)"
# Newer packages may ship /usr/lib/modules (merged /usr); normalise to lib/.
if [[ ! -d $work/tree/lib/modules/$ver && -d $work/tree/usr/lib/modules/$ver ]]; then
  mkdir -p "$work/tree/lib"
  mv "$work/tree/usr/lib/modules" "$work/tree/lib/modules"
fi
[[ -f $work/tree/boot/vmlinuz-$ver ]] || die "package $pkg has no boot/vmlinuz-$ver"
[[ -d $work/tree/lib/modules/$ver ]] || die "package $pkg has no lib/modules/$ver"

log "depmod -b <unpacked tree> $ver"
timeout 300 depmod -b "$work/tree" "$ver" || die "depmod -b failed on $work/tree"

printf '%s\n' "$ver" >"$work/tree/.ufab-complete"
rm -rf -- "$dir"
mv "$work/tree" "$dir"
log "kernel $ver ready in $dir"
finish "$dir"
