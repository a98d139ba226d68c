#!/usr/bin/env bash
# Builds ufab's fuzz targets with clang (libFuzzer + ASan + UBSan) and runs
# each for a bounded time over its committed seed corpus.
#
#   tests/fuzz/run.sh [SECONDS] [TARGET...]   default 30 s; targets: roce_parse arp cm_mad rdma_receive
#
# Bazel builds ufab with gcc, which has no libFuzzer, so this compiles the
# targets straight from the sources into a cache outside the repository
# ($UFAB_FUZZ_CACHE, default ~/.cache/ufab/fuzz). Inputs libFuzzer finds are
# kept there (<target>/corpus) and reused by the next run; the committed
# seeds in tests/fuzz/corpus/<target> are only read. A crash leaves its
# input in <target>/crashes/ and makes the script exit 1.
#
# clang 16 is needed: clang 14 cannot parse libstdc++ 12's <expected>, which
# ufab's Result type uses. libstdc++ 12 gates <expected> on __cpp_concepts
# >= 202002L, which clang 16 implements but still reports as 201907L, hence
# the macro override below.
#
# rdma_receive builds the whole RDMA stack (api, transport, swnic and the
# other built-in drivers, dma, vfio) from source, which takes a few minutes
# the first time; each fuzzing process opens its own swnic link
# (/dev/shm/ufab-swnic-rfz<pid>, removed when the process exits normally).
#
# Environment: CXX_FUZZ (default clang++-16), FUZZ_JOBS (parallel fuzzing
# processes, default 1), FUZZ_ARGS (extra libFuzzer flags).
set -euo pipefail

secs=${1:-30}
case "$secs" in
  '' | *[!0-9]*) echo "usage: $0 [SECONDS] [TARGET...]" >&2; exit 2 ;;
esac
shift || true
targets=("$@")
[ "${#targets[@]}" -gt 0 ] || targets=(roce_parse arp cm_mad rdma_receive)

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cache=${UFAB_FUZZ_CACHE:-$HOME/.cache/ufab/fuzz}
cxx=${CXX_FUZZ:-clang++-16}
jobs=${FUZZ_JOBS:-1}

die() { echo "fuzz: $*" >&2; exit 1; }

command -v "$cxx" >/dev/null ||
  die "$cxx not found: install clang-16 (scripts/setup.sh does), or set CXX_FUZZ"
rt_dir=$("$cxx" -print-runtime-dir 2>/dev/null || true)
if [ -z "$rt_dir" ] || ! ls "$rt_dir"/libclang_rt.fuzzer*.a >/dev/null 2>&1; then
  # Debian keeps the runtimes under the resource directory.
  rt_dir=$("$cxx" -print-resource-dir)/lib/linux
  ls "$rt_dir"/libclang_rt.fuzzer*.a >/dev/null 2>&1 ||
    die "libFuzzer runtime missing ($rt_dir): install libclang-rt-16-dev"
fi

# fuzz NAME SOURCES...: build (when stale) and run one target. Headers the
# target includes beyond core/*/*.h and base/*.h go in $extra_headers, link
# options in $extra_libs.
fuzz() {
local name=$1
shift
local srcs=("$@")
local headers=("$root"/core/*/*.h "$root"/base/*.h ${extra_headers:-})
local work=$cache/$name
local bin=$cache/${name}_fuzzer
mkdir -p "$work/corpus" "$work/crashes"

# Rebuild when a source or header is newer than the binary.
stale=0
[ -x "$bin" ] || stale=1
if [ "$stale" = 0 ]; then
  for f in "${srcs[@]}" "${headers[@]}" "$0"; do
    [ "$f" -nt "$bin" ] && stale=1 && break
  done
fi
if [ "$stale" = 1 ]; then
  echo "fuzz $name: building with $cxx" >&2
  # A failed build fails the target: never fuzz a binary left from before.
  if ! "$cxx" -std=c++2b -U__cpp_concepts -D__cpp_concepts=202002L -Wno-builtin-macro-redefined \
    -O1 -g -fno-omit-frame-pointer \
    -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
    -Wall -Wextra -Werror -I "$root" -I "$root/api" "${srcs[@]}" ${extra_libs:-} -o "$bin.tmp"; then
    echo "fuzz $name: BUILD FAILED (above); the target is not fuzzed" >&2
    rm -f "$bin" "$bin.tmp"
    return 1
  fi
  mv "$bin.tmp" "$bin"
fi

local log=$work/last_run.log
parallel=()
if [ "$jobs" -gt 1 ]; then
  # Each worker fuzzes the whole time; libFuzzer writes their output to
  # fuzz-N.log in the working directory, which is $work.
  parallel=(-jobs="$jobs" -workers="$jobs")
fi
rm -f "$work"/fuzz-*.log
start=$(date +%s)
set +e
# shellcheck disable=SC2086
(cd "$work" && "$bin" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
  "${parallel[@]}" -artifact_prefix="$work/crashes/" ${FUZZ_ARGS:-} \
  "$work/corpus" "$root/tests/fuzz/corpus/$name") >"$log" 2>&1
rc=$?
set -e
elapsed=$(( $(date +%s) - start ))
cat "$work"/fuzz-*.log >>"$log" 2>/dev/null || true
runs=$(awk '/stat::number_of_executed_units:/ {n += $2} END {print n + 0}' "$log")

if [ "$rc" -ne 0 ]; then
  artifact=$(grep -o "Test unit written to [^ ]*" "$log" | tail -n1 | sed 's/Test unit written to //')
  reason=$(grep -m1 -E "ERROR: (AddressSanitizer|libFuzzer|UndefinedBehaviorSanitizer)|runtime error|property violated" "$log" || true)
  echo "fuzz $name: CRASH after ${elapsed} s (exit $rc): ${reason:-see $log}" >&2
  [ -n "$artifact" ] && echo "fuzz $name: input saved as $artifact; replay: $bin $artifact" >&2
  echo "fuzz $name: full log in $log" >&2
  return 1
fi
echo "fuzz $name: $runs runs in $elapsed s, no crash"
}

status=0
for t in "${targets[@]}"; do
  case "$t" in
    roce_parse)
      fuzz roce_parse "$root/tests/fuzz/roce_parse_fuzzer.cc" "$root"/core/roce/{builder,headers,icrc,opcodes,parser}.cc ||
        status=1 ;;
    arp) fuzz arp "$root/tests/fuzz/arp_fuzzer.cc" "$root"/core/net/{arp,addresses}.cc || status=1 ;;
    cm_mad) fuzz cm_mad "$root/tests/fuzz/cm_mad_fuzzer.cc" "$root"/core/cm/{mad,rdma_cm}.cc || status=1 ;;
    rdma_receive)
      # The sources are what Bazel builds into the same fuzz entry point
      # (//tests/fuzz:rdma_receive_corpus_test), less its corpus driver:
      # no list here to fall behind the code.
      command -v bazel >/dev/null || die "rdma_receive: bazel is needed to list the target's sources"
      q=$(cd "$root" && bazel query --noshow_progress 'kind("source file", deps(//tests/fuzz:rdma_receive_corpus_test))' 2>/dev/null |
        sed -n 's#^//\([^:]*\):\(.*\)$#\1/\2#p; s#^//:\(.*\)$#\1#p' | sed 's#^/##') ||
        die "rdma_receive: bazel query of //tests/fuzz:rdma_receive_corpus_test failed"
      mapfile -t rr_srcs < <(grep -E '\.(cc|c)$' <<<"$q" | grep -v '^tests/fuzz/corpus_main.cc$' | sed "s#^#$root/#")
      [ "${#rr_srcs[@]}" -gt 10 ] || die "rdma_receive: bazel query listed ${#rr_srcs[@]} sources"
      extra_headers=$(grep -E '\.h$' <<<"$q" | sed "s#^#$root/#" | tr '\n' ' ') \
      extra_libs="-lrt -ldl -lpthread" \
      fuzz rdma_receive "${rr_srcs[@]}" ||
        status=1 ;;
    *) die "unknown target '$t' (roce_parse, arp, cm_mad, rdma_receive)" ;;
  esac
done
exit "$status"
