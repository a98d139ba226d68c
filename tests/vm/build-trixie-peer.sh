#!/usr/bin/env bash
# Builds tests/vm/peers/flush_verbs with FLUSH (-DUFAB_VERBS_FLUSH=1)
# against Debian 13's rdma-core headers (ibv_wr_flush, rdma-core >= 45), to
# run chrooted in the trixie root file system that fetch-trixie-verbs.sh
# makes (tests/vm/rxe_flush_guest.sh does, inside the VM).
#
# Usage: tests/vm/build-trixie-peer.sh [--quiet]
#
# The compiler is the host's g++ (Debian 12's gcc 12, -std=c++2b, as Bazel
# builds); only <infiniband/*.h> come from the chroot (through an include
# directory that holds nothing else), so the rest of the program is built
# against the host's libc and libstdc++, which trixie's newer ones serve.
# It links against the host's libibverbs.so.1: the symbols it uses are the
# same in 44 and 56 (ibv_wr_* and ibv_create_qp_ex are inline, through the
# provider's function pointers), and in the chroot trixie's libibverbs 56
# and its rxe provider load. The ufab pieces it needs (tools/exchange,
# base, core/roce) are compiled from this checkout.
#
# Output: <cache>/flush_verbs-<hash> (the hash covers the sources, the
# headers and this script; an up-to-date one is reused), printed as the
# last line. <cache> is fetch-trixie-verbs.sh's. Exit status 0 or 1.
set -euo pipefail

readonly PROG=build-trixie-peer.sh
HERE=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd -- "$HERE/../.." && pwd)
CACHE=${UFAB_TRIXIE_CACHE:-${HOME:-/root}/.cache/ufab/trixie-verbs}
QUIET=0
[[ ${1:-} == --quiet || ${1:-} == -q ]] && QUIET=1
log() { [[ $QUIET == 1 ]] || printf '%s: %s\n' "$PROG" "$*" >&2; }
die() { printf '%s: error: %s\n' "$PROG" "$*" >&2; exit 1; }

quiet=()
[[ $QUIET == 1 ]] && quiet=(--quiet)
ROOT=$("$HERE/fetch-trixie-verbs.sh" "${quiet[@]}" | tail -n1) || die "no trixie chroot (fetch-trixie-verbs.sh failed, see above)"
command -v g++ >/dev/null || die "g++ not found (apt-get install g++)"

srcs=(
  tests/vm/peers/flush_verbs.cc tools/exchange/exchange.cc
  base/files.cc base/hex.cc base/json.cc base/pci_address.cc
  core/roce/builder.cc core/roce/gid.cc core/roce/headers.cc core/roce/icrc.cc core/roce/opcodes.cc core/roce/parser.cc
)
cd "$REPO"
hash=$( { cat "${srcs[@]}" "$0"; find base tools/exchange core/roce api/ufab -name '*.h' -o -name '*.hpp' | sort | xargs cat;
  cat "$ROOT"/usr/include/infiniband/*.h; g++ --version; } | sha256sum | cut -c1-16)
out=$CACHE/flush_verbs-$hash
if [[ -x $out ]]; then
  log "up to date: $out"
  printf '%s\n' "$out"
  exit 0
fi

# <infiniband/...> from trixie, nothing else from its /usr/include.
shim=$CACHE/include
mkdir -p "$shim"
ln -sfn "$ROOT/usr/include/infiniband" "$shim/infiniband"
log "compiling flush_verbs with FLUSH against trixie's $(grep -o 'libibverbs1 [^ ]*' "$ROOT/.ufab-complete" || echo libibverbs) headers"
tmp=$(mktemp -d "$CACHE/build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
timeout 600 g++ -std=c++2b -O2 -Wall -Wextra -Werror -Wno-missing-field-initializers -DUFAB_VERBS_FLUSH=1 \
  -isystem "$shim" -I. -Iapi "${srcs[@]}" -o "$tmp/flush_verbs" -libverbs ||
  die "g++ failed (see above)"
mv -f "$tmp/flush_verbs" "$out"
find "$CACHE" -maxdepth 1 -name 'flush_verbs-*' ! -path "$out" -delete
log "built $out"
printf '%s\n' "$out"
