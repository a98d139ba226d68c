#!/usr/bin/env bash
# The VM test bed's own checks (tests/vm/selftest.sh), counted per check.
# Ends with "testbed: N passed, M failed".
set -uo pipefail
cd "$(dirname "$0")/../../.."
out=$(mktemp)
trap 'rm -f "$out"' EXIT
tests/vm/selftest.sh 2>&1 | tee "$out"
rc=${PIPESTATUS[0]}
passed=$(grep -c '^PASS' "$out")
failed=$(grep -c '^FAIL' "$out")
if [ "$rc" -ne 0 ] && [ "$failed" -eq 0 ]; then failed=1; fi
echo "testbed: $passed passed, $failed failed"
[ "$rc" -eq 0 ]
