#!/usr/bin/env bash
# Open MPI over the libfabric provider on this host: two ranks, each with
# its own port of a software NIC link (rank r: swnic:LINK:r at 10.0.0.r+1),
# Open MPI's cm PML with the OFI MTL on "ufab;ofi_rxm" (rxm's FI_EP_RDM
# with FI_TAGGED over our FI_EP_MSG). Runs tests/mpi/mpi_check.c (every
# byte of 1 B to 4 MiB point-to-point checked, allreduce and bcast against
# the arithmetic) and hpcc (HPL, PTRANS, STREAM, RandomAccess, FFT, with
# their own checks) at a small size; checks that the OFI MTL ran on the ufab
# domains. The recipe is docs/fabric.md's "MPI".
#
#   tests/fabric/mpi_test.sh [PATH_TO_libufab-fi.so [PATH_TO_mpi_check.c]]
set -uo pipefail

name=mpi_test
so=${1:-bazel-bin/fabric/libufab-fi.so}
src=${2:-tests/mpi/mpi_check.c}
if [ "$so" = none ]; then
  echo "$name: SKIP: libufab-fi.so is not built here: no libfabric headers (apt-get install libfabric-dev)"
  exit 0
fi
for t in mpirun mpicc hpcc; do
  if ! command -v "$t" >/dev/null; then
    echo "$name: SKIP: $t not installed (apt-get install openmpi-bin libopenmpi-dev hpcc; scripts/setup.sh does)"
    exit 0
  fi
done
[ -f "$so" ] || { echo "$name: no $so (bazel build //fabric:libufab-fi.so)"; exit 1; }
dir=$(mktemp -d "${TEST_TMPDIR:-/tmp}/$name.XXXXXX")
link=mpi$$
cleanup() { rm -rf "$dir"; rm -f "/dev/shm/ufab-swnic-$link"; }
trap cleanup EXIT
passed=0 failed=0
pass() { passed=$((passed + 1)); echo "PASS $*"; }
fail() { failed=$((failed + 1)); echo "FAIL $*"; }
show() { echo "--- $1"; tail -n 25 "$1" | cut -c1-160 | sed 's/^/  | /'; }

mkdir -p "$dir/prov"
cp "$so" "$dir/prov/libufab-fi.so"
if ! mpicc -O2 -o "$dir/mpi_check" "$src" 2>"$dir/mpicc.err"; then
  fail "mpicc $src"; show "$dir/mpicc.err"; exit 1
fi
cat >"$dir/rank.sh" <<'EOS'
#!/bin/bash
# Each rank its own port of the link.
r=${OMPI_COMM_WORLD_RANK:?not started by mpirun}
export FI_UFAB_DEVICES="swnic:${UFAB_LINK}:${r}@10.0.0.$((r + 1))"
exec "$@"
EOS
chmod +x "$dir/rank.sh"
export HOME=${HOME:-$dir} OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export FI_PROVIDER_PATH=$dir/prov UFAB_LINK=$link FI_PROVIDER="ufab;ofi_rxm"
mpi() { # mpirun over ufab: 2 ranks
  timeout 300 mpirun --oversubscribe -np 2 -x FI_PROVIDER_PATH -x UFAB_LINK -x FI_PROVIDER \
    --mca pml cm --mca mtl ofi --mca mtl_ofi_provider_include "ufab;ofi_rxm" --mca btl self \
    --mca mtl_base_verbose 100 "$dir/rank.sh" "$@"
}

# 1. mpi_check.
(cd "$dir" && mpi ./mpi_check) >"$dir/check.out" 2>&1
rc=$?
if [ $rc -eq 0 ] && grep -q "mpi_check: [0-9]* checks passed on 2 ranks" "$dir/check.out"; then
  pass "mpi_check over ufab;ofi_rxm: $(grep -o '[0-9]* checks passed' "$dir/check.out")"
else
  fail "mpi_check (rc $rc)"; show "$dir/check.out"
fi
n=$(grep -c "mtl:ofi:provider: swnic:$link:[01]" "$dir/check.out")
[ "$n" -eq 2 ] && pass "both ranks' OFI MTL on the ufab domains" || { fail "OFI MTL domains ($n of 2 ranks on ufab)"; show "$dir/check.out"; }
rm -f "/dev/shm/ufab-swnic-$link"

# 2. hpcc, 1 x 2 process grid, N=1000.
sed -e 's/^2            Ps/1            Ps/' /usr/share/doc/hpcc/examples/_hpccinf.txt >"$dir/hpccinf.txt" 2>/dev/null ||
  { fail "no /usr/share/doc/hpcc/examples/_hpccinf.txt"; }
(cd "$dir" && mpi hpcc) >"$dir/hpcc.out" 2>&1
rc=$?
out=$dir/hpccoutf.txt
if [ $rc -eq 0 ] && [ -f "$out" ] && grep -q "End of HPC Challenge tests" "$out" &&
   grep -q "0 tests completed and failed residual checks" "$out" && ! grep -q "FAILED" "$out" &&
   grep -q "Solution Validates" "$out"; then
  pass "hpcc completed, its checks passed ($(grep -c 'PASSED' "$out") PASSED lines, 0 FAILED)"
else
  fail "hpcc (rc $rc)"; show "$dir/hpcc.out"; [ -f "$out" ] && show "$out"
fi

echo "$name: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
