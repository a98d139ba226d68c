#!/usr/bin/env bash
# Runs examples/rdma_c_example (the C API from C) against each provider:
# the shared-memory provider (shm:cexPID) and soft-RoCE over a software NIC
# link (swnic:cexPID:0/1). Each run must print every step and "all steps
# passed" and exit 0; a usage error exits 2.
#   bazel test //tests/examples:rdma_c_example_test
set -uo pipefail

bin=${1:-examples/rdma_c_example}
[ -x "$bin" ] || bin=bazel-bin/examples/rdma_c_example
[ -x "$bin" ] || { echo "rdma_c_example_test: no rdma_c_example binary (bazel build //examples:rdma_c_example)"; exit 1; }

pass=0
fail=0
check() {  # name, command...
  local name=$1
  shift
  local out rc
  out=$(timeout 60 "$@" 2>&1)
  rc=$?
  local want=(SEND_WITH_IMM RDMA_WRITE RDMA_READ FETCH_AND_ADD "bad rkey: remote access error" "all steps passed")
  local missing=""
  for w in "${want[@]}"; do grep -q "$w" <<<"$out" || missing+=" [$w]"; done
  if [ "$rc" -eq 0 ] && [ -z "$missing" ]; then
    echo "PASS $name"
    pass=$((pass + 1))
  else
    echo "FAIL $name: exit $rc, missing:${missing:- nothing}"
    echo "$out" | sed 's/^/    /'
    fail=$((fail + 1))
  fi
}

link=cex$$
check "shared-memory provider" "$bin" "shm:$link" "shm:$link"
check "soft-RoCE over swnic" "$bin" "swnic:$link:0" "swnic:$link:1" 10.0.0.1 10.0.0.2
rm -f "/dev/shm/ufab-swnic-$link"

out=$("$bin" 2>&1)
if [ $? -eq 2 ] && grep -q usage <<<"$out"; then echo "PASS usage error"; pass=$((pass + 1)); else
  echo "FAIL usage error: $out"; fail=$((fail + 1)); fi
out=$("$bin" nosuch:x nosuch:y 2>&1)
if [ $? -eq 1 ] && grep -q "ufab_device_open failed" <<<"$out"; then echo "PASS unknown device"; pass=$((pass + 1)); else
  echo "FAIL unknown device: $out"; fail=$((fail + 1)); fi

echo "rdma_c_example_test: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
