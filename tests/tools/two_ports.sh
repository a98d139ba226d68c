# Sourced by the tests that run two `ufab` processes over one software NIC
# link (swnic:LINK:0 and swnic:LINK:1): finds the binary, makes a work
# directory, cleans up the server and the link at exit, counts PASS/FAIL.
# The sourcing script sets `name` (for messages and the work directory)
# and `link` (a swnic link no concurrent run uses), then calls
#   two_ports_setup "${1:-}"
# and afterwards uses $bin, $dir, $server_pid, pass, fail, show and finish.
# shellcheck shell=bash disable=SC2154  # name, link: the sourcing script's

two_ports_setup() { # [PATH_TO_UFAB]
  bin=$1
  if [ -z "$bin" ]; then
    for candidate in tools/ufab/ufab bazel-bin/tools/ufab/ufab; do
      if [ -x "$candidate" ]; then bin=$candidate; break; fi
    done
  fi
  if [ ! -x "$bin" ]; then
    echo "$name: no ufab binary (bazel build //tools/ufab)"
    exit 1
  fi
  dir=$(mktemp -d "${TEST_TMPDIR:-/tmp}/$name.XXXXXX")
  server_pid=
  passed=0 failed=0
  trap two_ports_cleanup EXIT
}
two_ports_cleanup() {
  if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null; wait "$server_pid" 2>/dev/null; fi
  rm -rf "$dir"
  rm -f "/dev/shm/ufab-swnic-$link"  # left behind only if a process was killed
}
pass() { passed=$((passed + 1)); echo "PASS $*"; }
fail() { failed=$((failed + 1)); echo "FAIL $*"; }
# Each file of the work directory, long lines cut for the log.
show() { for f in "$@"; do echo "--- $f"; head -n 30 "$dir/$f" 2>/dev/null | cut -c1-160 | sed 's/^/  | /'; done; }
finish() {
  echo "$name: $passed passed, $failed failed"
  [ "$failed" -eq 0 ]
}
