#!/usr/bin/env bash
# Makes a Debian 13 (trixie) root file system with rdma-core's libibverbs
# (56.x: ibv_wr_flush, which Debian 12's 44 lacks), for the VM test bed's
# FLUSH interop: a verbs peer built against its headers runs chrooted in it,
# inside the VM, on the guest kernel's rxe0. Cached outside the repository;
# a second run finds it complete and downloads nothing.
#
# Usage: tests/vm/fetch-trixie-verbs.sh [--quiet]
#
# Cache: ${UFAB_TRIXIE_CACHE:-$HOME/.cache/ufab/trixie-verbs}/root is the
# chroot (debootstrap --variant=minbase trixie, plus libibverbs1,
# ibverbs-providers and libibverbs-dev), about 250 MB; root/.ufab-complete
# marks it finished (a partial one is removed and made again). The last line
# printed is the chroot's path. Mirror: UFAB_TRIXIE_MIRROR (default the
# system's Debian mirror, else http://deb.debian.org/debian). Needs
# debootstrap (scripts/setup.sh installs it) and root. Bounded: the
# debootstrap run by UFAB_TRIXIE_LIMIT seconds (default 900), the lock wait
# by 900 s.
#
# Exit status: 0 ready; 1 it could not be made (the message says why).
set -euo pipefail

readonly PROG=fetch-trixie-verbs.sh
CACHE=${UFAB_TRIXIE_CACHE:-${HOME:-/root}/.cache/ufab/trixie-verbs}
ROOT=$CACHE/root
LIMIT=${UFAB_TRIXIE_LIMIT:-900}
QUIET=0
PACKAGES=libibverbs1,ibverbs-providers,libibverbs-dev

log() { [[ $QUIET == 1 ]] || printf '%s: %s\n' "$PROG" "$*" >&2; }
die() { printf '%s: error: %s\n' "$PROG" "$*" >&2; exit 1; }

while (($#)); do
  case $1 in
    --quiet|-q) QUIET=1; shift ;;
    -h|--help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done

complete() {
  [[ -f $ROOT/.ufab-complete && -f $ROOT/usr/include/infiniband/verbs.h && -e $ROOT/usr/lib/x86_64-linux-gnu/libibverbs.so.1 ]] &&
    grep -q 'ibv_wr_flush' "$ROOT/usr/include/infiniband/verbs.h"
}
if complete; then
  log "using the trixie chroot in $ROOT ($(<"$ROOT/.ufab-complete"))"
  printf '%s\n' "$ROOT"
  exit 0
fi

[[ $(id -u) == 0 ]] || die "debootstrap needs root; run as root (or as the test suite does, with sudo)"
command -v debootstrap >/dev/null 2>&1 || die "debootstrap not found: apt-get install debootstrap (scripts/setup.sh does)"
for tool in flock timeout; do command -v "$tool" >/dev/null 2>&1 || die "'$tool' not found (util-linux, coreutils)"; done
mkdir -p "$CACHE" || die "cannot create $CACHE (set UFAB_TRIXIE_CACHE to a writable place)"
exec 9>"$CACHE/.lock"
flock -w 900 9 || die "another $PROG holds $CACHE/.lock for over 15 min; remove it if stale"
if complete; then  # made by the run we waited for
  printf '%s\n' "$ROOT"
  exit 0
fi

mirror=${UFAB_TRIXIE_MIRROR:-}
if [[ -z $mirror ]]; then
  mirror=$(grep -rhs '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '$2 ~ /\/debian\/?$/ {print $2; exit}')
  [[ -n $mirror ]] || mirror=$(awk '$1=="deb" && $2 ~ /\/debian\/?$/ {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
  [[ -n $mirror ]] || mirror=http://deb.debian.org/debian
fi
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
[[ -r $keyring ]] || die "no $keyring (apt-get install debian-archive-keyring)"

if [[ -e $ROOT ]]; then
  log "removing an incomplete chroot in $ROOT"
  # A debootstrap killed half way may leave its /proc mounted.
  for m in proc sys dev/pts dev; do umount -l "$ROOT/$m" 2>/dev/null || true; done
  rm -rf --one-file-system -- "$ROOT" || die "cannot remove $ROOT"
fi
log "debootstrap trixie (minbase + $PACKAGES) from $mirror into $ROOT (about 250 MB, a few minutes; bounded by $LIMIT s)"
set +e
timeout -k 10 "$LIMIT" debootstrap --variant=minbase --include="$PACKAGES" --keyring="$keyring" \
  trixie "$ROOT" "$mirror" 2>&1 | while IFS= read -r line; do
  case $line in
    I:\ Retrieving*|I:\ Validating*|I:\ Extracting*|I:\ Unpacking\ *|I:\ Configuring\ *) ;;  # one line a package
    *) log "$line" ;;
  esac
done
rc=${PIPESTATUS[0]}
set -e
for m in proc sys dev/pts dev; do umount -l "$ROOT/$m" 2>/dev/null || true; done
if [[ $rc == 124 || $rc == 137 ]]; then
  die "debootstrap did not finish within $LIMIT s (UFAB_TRIXIE_LIMIT); a slow mirror? (UFAB_TRIXIE_MIRROR)"
fi
((rc == 0)) || die "debootstrap failed (status $rc); see its lines above; its log is $ROOT/debootstrap/debootstrap.log when kept"
[[ -f $ROOT/usr/include/infiniband/verbs.h ]] || die "the chroot has no infiniband/verbs.h: libibverbs-dev was not installed"
grep -q 'ibv_wr_flush' "$ROOT/usr/include/infiniband/verbs.h" ||
  die "trixie's libibverbs-dev has no ibv_wr_flush (rdma-core < 45?)"
ver=$(chroot "$ROOT" dpkg-query -W -f='${Version}' libibverbs1 2>/dev/null || echo unknown)
rm -rf -- "$ROOT/var/cache/apt/archives/"*.deb
printf 'trixie, libibverbs1 %s\n' "$ver" >"$ROOT/.ufab-complete"
log "trixie chroot ready in $ROOT (libibverbs1 $ver, $(du -sh --one-file-system "$ROOT" | cut -f1))"
printf '%s\n' "$ROOT"
