#!/usr/bin/env bash
# The install step as an application author uses it: scripts/install.sh
# into a temporary prefix, then, outside the workspace, a C program
# (examples/rdma_c_example.c) and a C++ one built with
# `pkg-config --cflags --libs ufab` and run against both providers, their
# plugins loaded from PREFIX/lib/ufab-plugins. Also: the soname, the
# exported symbols, the installed CLI. Ends "install: N passed, M failed".
# Run from the repository root (scripts/test.sh does).
set -uo pipefail
cd "$(dirname "$0")/../.."
repo=$(pwd)

pass=0
fail=0
ok() { echo "PASS $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; [ -n "${2:-}" ] && echo "$2" | sed 's/^/    /'; fail=$((fail + 1)); }
finish() { echo "install: $pass passed, $fail failed"; [ "$fail" -eq 0 ]; exit $?; }

prefix=$(mktemp -d /tmp/ufab-prefix.XXXXXX)
work=$(mktemp -d /tmp/ufab-app.XXXXXX)
link=inst$$
cleanup() { rm -rf "$prefix" "$work"; rm -f "/dev/shm/ufab-swnic-$link"; }
trap cleanup EXIT

if out=$(scripts/install.sh "$prefix" 2>&1); then ok "scripts/install.sh $prefix"; else bad "scripts/install.sh" "$out"; finish; fi
export PKG_CONFIG_PATH=$prefix/lib/pkgconfig

soname=$(readelf -d "$prefix/lib/libufab.so.1" | sed -n 's/.*SONAME.*\[\(.*\)\]/\1/p')
[ "$soname" = libufab.so.1 ] && ok "soname libufab.so.1" || bad "soname is '$soname'"
others=$(nm -D --defined-only "$prefix/lib/libufab.so.1" | awk '$2 ~ /^[TDBR]$/ {print $3}' | grep -v '^ufab_' || true)
[ -z "$others" ] && ok "libufab exports only ufab_* functions and data" || bad "libufab exports more than ufab_*" "$others"

# Every public header in place and every function it declares exported.
missing=""
for h in rdma.h rdma.hpp cm.h cm.hpp stream.h stream_device.cuh; do [ -f "$prefix/include/ufab/$h" ] || missing+=" $h"; done
for f in ufab_cm_open ufab_stream_engine_create ufab_stream_post_send ufab_stream_wait ufab_stream_post_send_device \
  ufab_stream_wait_word; do
  nm -D --defined-only "$prefix/lib/libufab.so.1" | grep -q " T $f@" || missing+=" $f"
done
[ -z "$missing" ] && ok "headers rdma.h rdma.hpp cm.h cm.hpp stream.h stream_device.cuh installed; cm and stream functions exported" ||
  bad "missing from the install:$missing"
# The libfabric provider (when libfabric-dev is here): installed beside
# the prefix's lib, exporting fi_prov_ini only, and found by fi_info there.
if [ -e /usr/include/rdma/providers/fi_prov.h ]; then
  so=$prefix/lib/libfabric/libufab-fi.so
  if [ -f "$so" ]; then
    ok "libfabric provider installed in $prefix/lib/libfabric"
    exp=$(nm -D --defined-only "$so" | awk '$2 ~ /^[TDBR]$/ {print $3}')
    [ "$exp" = fi_prov_ini ] && ok "libufab-fi.so exports only fi_prov_ini" || bad "libufab-fi.so exports more" "$exp"
    if command -v fi_info >/dev/null; then
      out=$(FI_PROVIDER_PATH=$prefix/lib/libfabric FI_UFAB_DEVICES="swnic:$link:0@10.0.0.1" timeout 30 fi_info -p ufab 2>&1)
      rm -f "/dev/shm/ufab-swnic-$link"
      grep -q "domain: swnic:$link:0" <<<"$out" && ok "fi_info -p ufab finds the installed provider" || bad "fi_info -p ufab" "$out"
    fi
  else
    bad "libfabric provider not installed at $so"
  fi
fi

cd "$work" || finish
cp "$repo/examples/rdma_c_example.c" app.c
# shellcheck disable=SC2046
if out=$(cc -std=c11 -Wall -Wextra -Werror app.c $(pkg-config --cflags --libs ufab) -o app_c 2>&1); then
  ok "C program built with pkg-config outside the workspace"
else
  bad "C build" "$out"
fi
cat >app.cc <<'CXX'
// A C++ application: <ufab/rdma.hpp> over libufab.
#include <ufab/rdma.hpp>
#include <cstdio>
int main(int argc, char** argv) {
  if (argc != 2) return 2;
  auto dev = ufab::rdma::Device::open(argv[1], {.ip = "10.0.0.9"});
  if (!dev) { std::printf("error: %s\n", dev.error().message().c_str()); return 1; }
  auto pd = (*dev)->alloc_pd();
  auto cq = (*dev)->create_cq(16);
  if (!pd || !cq) return 1;
  auto qp = pd->create_qp({.send_cq = cq->get(), .recv_cq = cq->get()});
  if (!qp) { std::printf("error: %s\n", qp.error().message().c_str()); return 1; }
  std::printf("provider %s qp %u\n", (*dev)->provider().c_str(), (*qp)->qp_num());
  return 0;
}
CXX
# shellcheck disable=SC2046
if out=$(c++ -std=c++2b -Wall -Wextra -Werror app.cc $(pkg-config --cflags --libs ufab) -o app_cc 2>&1); then
  ok "C++ program built with pkg-config outside the workspace"
else
  bad "C++ build" "$out"
fi

run() {  # name, expected output, command...
  local name=$1 want=$2
  shift 2
  local out
  out=$(env -u UFAB_PLUGIN_PATH timeout 60 "$@" 2>&1)
  if [ $? -eq 0 ] && grep -q "$want" <<<"$out"; then ok "$name"; else bad "$name" "$out"; fi
}
run "C program on the shared-memory provider (plugin from $prefix/lib/ufab-plugins)" "all steps passed" \
  ./app_c "shm:$link" "shm:$link"
run "C program on soft-RoCE over swnic (plugin from $prefix/lib/ufab-plugins)" "all steps passed" \
  ./app_c "swnic:$link:0" "swnic:$link:1" 10.0.0.1 10.0.0.2
run "C++ program on the shared-memory provider" "provider shm qp" ./app_cc "shm:$link"
run "installed ufab CLI lists the plugins" "swnic" "$prefix/bin/ufab" plugins

finish
