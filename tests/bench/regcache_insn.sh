#!/usr/bin/env bash
# Instructions per registration-cache hit (ufab_mr_cache_reg +
# ufab_mr_cache_release of a cached range, through the C API), counted by
# callgrind on tests/bench/regcache_insn_bench.cc. valgrind lacks
# userfaultfd, so tests/bench/fake_uffd.so is preloaded in its place (it
# never reports an unmapping, which no measured pair needs). Per row: the
# instructions of N2 pairs minus those of N1 pairs, over N2 - N1 (so the
# warm-up misses cancel out), in all and in each of the two calls.
#
#   tests/bench/regcache_insn.sh [--bin REGCACHE_INSN_BENCH] [--shim FAKE_UFFD_SO]
set -euo pipefail
cd "$(dirname "$0")/../.."
bin="" shim=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --bin) bin="$2"; shift 2 ;;
    --shim) shim="$2"; shift 2 ;;
    *) echo "usage: $0 [--bin REGCACHE_INSN_BENCH] [--shim FAKE_UFFD_SO]" >&2; exit 2 ;;
  esac
done
command -v valgrind >/dev/null || { echo "regcache_insn.sh: valgrind is not installed" >&2; exit 1; }
if [[ -z "$bin" || -z "$shim" ]]; then
  bazel build //tests/bench:regcache_insn_bench //tests/bench:fake_uffd.so >/dev/null 2>&1 ||
    bazel build //tests/bench:regcache_insn_bench //tests/bench:fake_uffd.so
  bin="${bin:-bazel-bin/tests/bench/regcache_insn_bench}"
  shim="${shim:-$PWD/bazel-bin/tests/bench/fake_uffd.so}"
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
n1=2000 n2=12000
# Instructions of ufab_mr_cache_reg, ufab_mr_cache_release (inclusive) and
# in all, within insn_measured.
count() {
  local out="$tmp/cg" log="$tmp/log"
  if ! LD_PRELOAD="$shim" valgrind --tool=callgrind --toggle-collect='*insn_measured*' \
      --callgrind-out-file="$out" "$bin" "$@" >"$log" 2>&1; then
    cat "$log" >&2
    exit 1
  fi
  grep -q "userfaultfd;" "$log" || { echo "regcache_insn.sh: host memory is not cached here:" >&2; cat "$log" >&2; exit 1; }
  callgrind_annotate --inclusive=yes "$out" 2>/dev/null | awk '
    /ufab_mr_cache_reg[^_]|ufab_mr_cache_reg$/ && !r { gsub(",", "", $1); r = $1 }
    /ufab_mr_cache_release/ && !l { gsub(",", "", $1); l = $1 }
    /PROGRAM TOTALS/ { gsub(",", "", $1); t = $1 }
    END { print r + 0, l + 0, t + 0 }'
}
printf "%-8s %10s %7s %14s %18s %10s\n" memory bytes ranges "reg insn/hit" "release insn/hit" "total/hit"
for row in "host 4096 1" "host 1048576 1" "host 67108864 1" "host/8 4096 8"; do
  set -- $row
  read -r r1 l1 t1 < <(count --bytes "$2" --ranges "$3" --n $n1)
  read -r r2 l2 t2 < <(count --bytes "$2" --ranges "$3" --n $n2)
  d=$((n2 - n1))
  awk -v m="$1" -v b="$2" -v k="$3" -v r=$((r2 - r1)) -v l=$((l2 - l1)) -v t=$((t2 - t1)) -v d=$d \
    'BEGIN { printf "%-8s %10s %7s %14.1f %18.1f %10.1f\n", m, b, k, r / d, l / d, t / d }'
done
