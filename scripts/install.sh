#!/usr/bin/env bash
# Installs ufab under a prefix, so applications outside this repository build
# with `cc app.c $(pkg-config --cflags --libs ufab)`:
#   PREFIX/lib/libufab.so.1.0.0 (+ libufab.so.1, libufab.so)  the C API
#   PREFIX/lib/ufab-plugins/libufab_*.so    device plugins, loaded at run time
#   PREFIX/include/ufab/rdma.h, rdma.hpp, cm.h, cm.hpp, stream.h, stream_device.cuh
#                                           the C, C++ and CUDA device headers
#   PREFIX/include/ufab/base/error.h        errors as values (for rdma.hpp)
#   PREFIX/lib/pkgconfig/ufab.pc
#   PREFIX/bin/ufab                         the CLI
#   the libfabric provider libufab-fi.so (when libfabric-dev is installed):
#   in /usr/lib/<multiarch>/libfabric/ for PREFIX /usr (where Debian's
#   libfabric looks), else in PREFIX/lib/libfabric/ (FI_PROVIDER_PATH=that
#   directory); docs/fabric.md
# Usage: scripts/install.sh PREFIX     (e.g. /usr/local, or $HOME/.local)
# Then: export PKG_CONFIG_PATH=PREFIX/lib/pkgconfig when PREFIX is not a
# system prefix. Builds with Bazel first (scripts/setup.sh installs it).
set -euo pipefail

die() { printf 'install: error: %s\n' "$*" >&2; exit 1; }
[ $# -eq 1 ] || die "usage: scripts/install.sh PREFIX (an absolute or relative directory)"
cd "$(dirname "$0")/.."
command -v bazel >/dev/null || die "bazel not found: run scripts/setup.sh first"

mkdir -p "$1" || die "cannot create $1"
prefix=$(cd "$1" && pwd)
version=$(awk '/#define UFAB_API_MAJOR/ {ma=$3} /#define UFAB_API_MINOR/ {mi=$3} END {print ma "." mi ".0"}' api/ufab/rdma.h)
major=${version%%.*}

plugins=(//drivers/e1000e:libufab_e1000e.so //drivers/virtio_net:libufab_virtio_net.so
         //drivers/swnic:libufab_swnic.so //drivers/shm:libufab_shm.so)
echo "install: building libufab.so, the plugins and the CLI" >&2
log=$(mktemp)
if ! bazel build //lib:libufab.so //tools/ufab "${plugins[@]}" >"$log" 2>&1; then
  grep -E 'ERROR|error:' "$log" | head -20 >&2
  rm -f "$log"
  die "bazel build failed (above)"
fi
rm -f "$log"
bin=$(bazel info bazel-bin 2>/dev/null)
fabric=
if [ -e /usr/include/rdma/providers/fi_prov.h ] || [ -n "${LIBFABRIC_PREFIX:-}" ]; then
  echo "install: building the libfabric provider libufab-fi.so" >&2
  if bazel build //fabric:libufab-fi.so >/dev/null 2>&1; then fabric=$bin/fabric/libufab-fi.so
  else die "bazel build //fabric:libufab-fi.so failed (run it to see why)"; fi
fi

install -d -m 755 "$prefix/bin" "$prefix/lib" "$prefix/lib/ufab-plugins" "$prefix/lib/pkgconfig" \
  "$prefix/include/ufab/base"
install -m 755 "$bin/lib/libufab.so" "$prefix/lib/libufab.so.$version"
ln -sfn "libufab.so.$version" "$prefix/lib/libufab.so.$major"
ln -sfn "libufab.so.$major" "$prefix/lib/libufab.so"
for p in "${plugins[@]}"; do
  path=${p#//}; path=${path/://}
  install -m 755 "$bin/$path" "$prefix/lib/ufab-plugins/"
done
install -m 644 api/ufab/rdma.h api/ufab/rdma.hpp api/ufab/cm.h api/ufab/cm.hpp api/ufab/stream.h api/ufab/stream_device.cuh \
  "$prefix/include/ufab/"
install -m 644 base/error.h "$prefix/include/ufab/base/"
install -m 755 "$bin/tools/ufab/ufab" "$prefix/bin/ufab"
if [ -n "$fabric" ]; then
  if [ "$prefix" = /usr ]; then
    fabric_dir=/usr/lib/$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)/libfabric
  else
    fabric_dir=$prefix/lib/libfabric
  fi
  install -d -m 755 "$fabric_dir"
  install -m 755 "$fabric" "$fabric_dir/libufab-fi.so"
  echo "install: libfabric provider in $fabric_dir/libufab-fi.so" >&2
fi
sed -e "s|@PREFIX@|$prefix|" -e "s|@VERSION@|$version|" lib/ufab.pc.in >"$prefix/lib/pkgconfig/ufab.pc"
chmod 644 "$prefix/lib/pkgconfig/ufab.pc"
echo "install: ufab $version in $prefix (pkg-config: PKG_CONFIG_PATH=$prefix/lib/pkgconfig)" >&2
