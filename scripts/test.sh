#!/usr/bin/env bash
# The whole ufab test suite: unit tests, then the VM tests (real VFIO behind
# QEMU's intel-iommu, QEMU's NIC models). Installs what is missing first.
# Ends with one line "tests: N passed, M failed" and exits non-zero on failure.
set -uo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)

scripts/setup.sh || exit 1

passed=0
failed=0
failed_names=()
record() {  # name, passed count, failed count
  passed=$((passed + $2)); failed=$((failed + $3))
  if [ "$3" -gt 0 ]; then failed_names+=("$1"); fi
}

echo "== unit tests (bazel test //tests/unit/... //tests/fuzz/... //tests/examples/... //tests/tools/... //tests/fabric/...)"
bazel test //tests/unit/... //tests/fuzz/... //tests/examples/... //tests/tools/... //tests/fabric/... 2>&1 | grep -v '^INFO: \|^Loading\|^Analyzing' | sed -n '/FAIL\|Executed\|ERROR\|PASSED\|passed/p'
bazel_rc=${PIPESTATUS[0]}
# Count test cases, not targets, from the JUnit XML that gtest wrote. For a
# test that writes none (sh_test), Bazel writes one whose totals are on the
# <testsuite> line: one case.
unit_pass=0; unit_fail=0
while IFS= read -r xml; do
  line=$(grep -m1 '<testsuites' "$xml" || true)
  if ! grep -q ' tests="' <<<"$line"; then line=$(grep -m1 '<testsuite ' "$xml" || true); fi
  t=$(sed -n 's/.* tests="\([0-9]*\)".*/\1/p' <<<"$line"); f=$(sed -n 's/.* failures="\([0-9]*\)".*/\1/p' <<<"$line")
  e=$(sed -n 's/.* errors="\([0-9]*\)".*/\1/p' <<<"$line")
  t=${t:-0}; f=${f:-0}; e=${e:-0}
  unit_pass=$((unit_pass + t - f - e)); unit_fail=$((unit_fail + f + e))
done < <(find -L bazel-testlogs/tests/unit bazel-testlogs/tests/fuzz bazel-testlogs/tests/examples bazel-testlogs/tests/tools bazel-testlogs/tests/fabric \
  -name test.xml 2>/dev/null)
if [ "$bazel_rc" -ne 0 ] && [ "$unit_fail" -eq 0 ]; then unit_fail=1; fi  # build break or crash
record unit "$unit_pass" "$unit_fail"
echo "unit: $unit_pass passed, $unit_fail failed"

echo "== threads under ThreadSanitizer (bazel test --config=tsan: the lanes stress test, the connection manager, the stream engine, the registration cache)"
# --symlink_prefix=/: no bazel-bin/bazel-testlogs links to the TSan build,
# which the sections below would otherwise pick up.
tsan_targets=(//tests/unit/provider:lanes_stress_test //tests/unit/cm:cm_test //tests/unit/stream:engine_test //tests/unit/regcache:cache_test)
bazel test --config=tsan --symlink_prefix=/ --test_env=TSAN_OPTIONS=halt_on_error=1 "${tsan_targets[@]}" 2>&1 |
  grep -v '^INFO: \|^Loading\|^Analyzing' | sed -n '/FAIL\|Executed\|ERROR\|PASSED\|passed/p'
tsan_rc=${PIPESTATUS[0]}
tsan_logs="$(bazel info --config=tsan bazel-testlogs 2>/dev/null)"
tt=0 tf=0
for t in "${tsan_targets[@]}"; do
  xml="$tsan_logs/$(sed 's|^//||; s|:|/|' <<<"$t")/test.xml"
  line=$(grep -m1 '<testsuites' "$xml" 2>/dev/null || true)
  n=$(sed -n 's/.* tests="\([0-9]*\)".*/\1/p' <<<"$line"); f=$(sed -n 's/.* failures="\([0-9]*\)".*/\1/p' <<<"$line")
  tt=$((tt + ${n:-0})); tf=$((tf + ${f:-0}))
done
if [ "$tsan_rc" -ne 0 ] && [ "$tf" -eq 0 ]; then tf=1; fi  # build break, or TSan halted the process
record tsan "$((tt - tf > 0 ? tt - tf : 0))" "$tf"
echo "tsan: $((tt - tf > 0 ? tt - tf : 0)) passed, $tf failed"

echo "== fuzzing (30 s per parser, 60 s for the RDMA receive path; tests/fuzz/run.sh SECONDS for longer)"
fuzz_out=$(mktemp)
tests/fuzz/run.sh 30 roce_parse arp cm_mad 2>&1 | tee "$fuzz_out"
fuzz_rc=${PIPESTATUS[0]}
tests/fuzz/run.sh 60 rdma_receive 2>&1 | tee -a "$fuzz_out"
[ "${PIPESTATUS[0]}" -eq 0 ] || fuzz_rc=1
fuzz_targets=4  # roce_parse, arp, cm_mad, rdma_receive
fuzz_ok=$(grep -c 'runs in .* no crash$' "$fuzz_out")
fuzz_bad=$((fuzz_targets - fuzz_ok))
if [ "$fuzz_rc" -ne 0 ] && [ "$fuzz_bad" -eq 0 ]; then fuzz_bad=1; fi
record fuzz "$fuzz_ok" "$fuzz_bad"
rm -f "$fuzz_out"

echo "== install (scripts/install.sh into a temporary prefix; C and C++ programs built with pkg-config)"
inst_out=$(mktemp)
tests/install/install_test.sh 2>&1 | tee "$inst_out"
inst_rc=${PIPESTATUS[0]}
inst_counts=$(grep -E '^install: [0-9]+ passed' "$inst_out" | tail -n1)
ip=$(sed -n 's/.*: \([0-9]*\) passed.*/\1/p' <<<"$inst_counts"); if_=$(sed -n 's/.* \([0-9]*\) failed.*/\1/p' <<<"$inst_counts")
ip=${ip:-0}; if_=${if_:-0}
if [ "$inst_rc" -ne 0 ] && [ "$if_" -eq 0 ]; then if_=1; fi
record install "$ip" "$if_"
rm -f "$inst_out"

echo "== build for the VM tests (bazel build //...)"
build_log=$(mktemp)
if ! bazel build //... >"$build_log" 2>&1; then
  grep -E 'ERROR|error:' "$build_log" | head -40
  record build 0 1
else
  for suite in tests/vm/suites/*.sh; do
    name=$(basename "$suite" .sh)
    echo "== VM suite $name"
    out=$(mktemp)
    "$suite" 2>&1 | tee "$out"
    rc=${PIPESTATUS[0]}
    # Each suite ends with "<name>: N passed, M failed".
    counts=$(grep -E '^[a-z_-]+: [0-9]+ passed, [0-9]+ failed' "$out" | tail -n1)
    p=$(sed -n 's/.*: \([0-9]*\) passed.*/\1/p' <<<"$counts"); f=$(sed -n 's/.* \([0-9]*\) failed.*/\1/p' <<<"$counts")
    p=${p:-0}; f=${f:-0}
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi
    record "$name" "$p" "$f"
    rm -f "$out"
  done
fi
rm -f "$build_log"

echo "== summary ($(( $(date +%s) - start )) s)"
if [ "${#failed_names[@]}" -gt 0 ]; then echo "failing: ${failed_names[*]}"; fi
echo "tests: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
