#!/usr/bin/env bash
# The GPU suite of issue 12 so far (docs/gpu.md): the CUDA loader,
# registration of device memory (detected with its GPU ordinal and buffer
# id), managed memory refused, a freed and reallocated buffer caught at post
# time and at the responder, GPU entries of the registration cache, and the
# staging pipeline with the real copy engine (pipeline_test's "cuda" cases:
# SEND/RECV, WRITE, WRITE_WITH_IMM, READ host<->GPU and GPU<->GPU at
# fragment boundaries, depths, 2% loss, every byte checked), the same
# over the shm provider between two processes (shm_gpu_test's "cuda"
# cases: every op and direction, 1 B to 4 MiB + 3, unaligned offsets, a
# buffer freed under a live region, staged and with GPU<->GPU through CUDA
# IPC (its path asserted per case, 1 B to 64 MiB, freed buffers, the
# requester killed mid-copy)), and the libfabric provider's FI_HMEM
# (tests/fabric/provider_gpu_test: cuMemAlloc'd buffers registered as
# FI_HMEM_CUDA over fi_write, fi_read and fi_send, every byte checked
# through device copies; it needs libfabric-dev where it is built, and the
# staged lib/ carries libfabric.so.1 and what it links).
#
#   tests/gpu/run.sh                 build with Bazel, then run here
#   tests/gpu/run.sh --stage DIR     build and copy the binaries to DIR (for a
#                                    GPU machine without Bazel)
#   tests/gpu/run.sh --from DIR      run binaries staged in DIR
#
# The binaries link ufab statically (--dynamic_mode=off) and glibc and
# libstdc++ dynamically: libcuda.so.1 is dlopen'ed, which a static glibc
# cannot do safely, and a newer distribution's glibc and libstdc++ (the GPU
# machine's) run what Debian 12 built. Exit status: 0 when
# every test passed, 1 otherwise; a machine without a GPU reports the GPU
# tests as skipped ("no GPU: ...") and fails the suite, since this suite is
# meant for a GPU machine (the README test command runs the same tests and
# accepts the skips).
set -euo pipefail
cd "$(dirname "$0")/../.."
targets=(//tests/unit/gpu:gpu_test //tests/unit/gpu:region_test //tests/unit/regcache:cache_test
         //tests/unit/staging:pipeline_test //tests/unit/drivers/shm:shm_gpu_test //tests/bench:regcache_bench
         //tools/ufab //tests/gpu:stream_gpu)
# The libfabric provider's GPU test exists where libfabric's headers are
# (//tests/fabric/BUILD); without them the suite says it is left out.
fabric_targets=(//tests/fabric:provider_gpu_test //fabric:libufab-fi.so)
mode=${1:-}
dir=${2:-}

build() {
  if bazel query //tests/fabric:provider_gpu_test >/dev/null 2>&1; then
    targets+=("${fabric_targets[@]}")
  else
    echo "gpu suite: //tests/fabric:provider_gpu_test is not built here (no libfabric headers: apt-get install libfabric-dev, then bazel sync --configure)" >&2
  fi
  bazel build --dynamic_mode=off "${targets[@]}" >&2
}
run_from() {
  local d=$1 fail=0 skipped
  if [ -d "$d/lib" ]; then export LD_LIBRARY_PATH="$d/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; fi
  # The provider's GPU test loads libufab-fi.so from beside it.
  export UFAB_FI_PROVIDER_DIR="$d"
  for t in gpu_test region_test cache_test pipeline_test shm_gpu_test provider_gpu_test; do
    if [ "$t" = provider_gpu_test ] && [ ! -x "$d/$t" ]; then
      echo "gpu suite: provider_gpu_test was not staged (built without libfabric's headers): the FI_HMEM test did not run"
      fail=1
      continue
    fi
    echo "== $t"
    out=$(timeout 300 "$d/$t" 2>&1) || fail=1
    echo "$out"
    # A GPU test that skipped for want of a GPU fails the suite (the
    # no-driver tests skip on a GPU machine, as they should).
    skipped=$(grep -c '^no GPU: ' <<<"$out" || true)
    if [ "$skipped" -gt 0 ]; then
      echo "gpu suite: $t skipped $skipped GPU test(s) (no GPU): not a GPU run"
      fail=1
    fi
  done
  echo "== ufab doctor (GPU lines)"
  # doctor's own exit status is about VFIO (none on the GPU machine): only
  # its GPU lines are looked at, and they must say ok.
  doc=$("$d/ufab" doctor 2>&1 || true)
  grep '^\[.*\] gpu' <<<"$doc" || fail=1
  if grep '^\[.*\] gpu' <<<"$doc" | grep -qv '^\[ok  \]'; then fail=1; fi
  echo "== stream-ordered operations on the GPU (kernel -> WRITE -> stream wait -> kernel)"
  timeout 300 "$d/stream_gpu" || fail=1
  echo "== destroying a stream engine releases a wait kernel (a run of its own: a failure leaves a kernel spinning)"
  timeout 120 "$d/stream_gpu" --release-test || fail=1
  echo "== stream-ordered ping-pong against the CPU-driven loop (not a test: timings)"
  timeout 300 "$d/stream_gpu" --bench --json "${STREAM_JSON:-/dev/null}" || fail=1
  echo "== ufab perf with GPU buffers between two processes"
  bash tests/gpu/perf_pairs.sh "$d/ufab" || fail=1
  echo "== ufab info gpu"
  # Every GPU listed with working stream memory operations.
  "$d/ufab" info gpu || fail=1
  "$d/ufab" info gpu --json | grep -q '"available":true' || { echo "ufab info gpu: no GPU available"; fail=1; }
  if "$d/ufab" info gpu --json | grep -q '"stream_memops":false'; then echo "ufab info gpu: stream memory operations fail"; fail=1; fi
  echo "== regcache_bench (not a test: timings)"
  "$d/regcache_bench" --json "${BENCH_JSON:-/dev/null}" || fail=1
  if [ "$fail" -eq 0 ]; then echo "gpu suite: PASSED"; else echo "gpu suite: FAILED"; fi
  return "$fail"
}

case "$mode" in
  --stage)
    [ -n "$dir" ] || { echo "usage: $0 --stage DIR" >&2; exit 2; }
    build
    mkdir -p "$dir"
    for t in "${targets[@]}"; do
      p=${t#//}; [[ $p == *:* ]] && p=${p/://} || p=$p/${p##*/}
      install -m 0755 "bazel-bin/$p" "$dir/"
    done
    # The libraries a GPU machine may lack (libpci, libudev, ...: not the
    # C and C++ runtimes, which it has in newer versions) go beside them.
    mkdir -p "$dir/lib"
    # libfabric.so.1 and its libraries for the provider's GPU test.
    for b in "$dir/ufab" "$dir/provider_gpu_test" "$dir/libufab-fi.so"; do
      if [ -e "$b" ]; then ldd "$b"; fi
    done | awk '/=> \// {print $3}' | sort -u | grep -Ev '/(libc|libm|libstdc\+\+|libgcc_s|ld-linux[^/]*)\.so' |
      while read -r lib; do cp -L "$lib" "$dir/lib/"; done
    # CUPTI (the toolkit's, for the registration cache's GPU free watch):
    # a GPU machine with only the driver lacks it.
    cupti=$( (ldconfig -p | awk '/libcupti\.so\.[0-9]+ / {print $NF}'; ls /usr/local/cuda/lib64/libcupti.so.* \
              /usr/local/cuda/extras/CUPTI/lib64/libcupti.so.* 2>/dev/null || true) | head -n1)
    if [ -n "$cupti" ]; then cp -L "$cupti" "$dir/lib/"; else echo "gpu suite: no libcupti here: the GPU free watch test will fail" >&2; fi
    echo "staged in $dir: $(ls "$dir" | tr '\n' ' ') lib: $(ls "$dir/lib" | tr '\n' ' ')" ;;
  --from)
    [ -n "$dir" ] || { echo "usage: $0 --from DIR" >&2; exit 2; }
    run_from "$dir" ;;
  "")
    build
    d=$(mktemp -d)
    trap 'rm -rf "$d"' EXIT
    for t in "${targets[@]}"; do
      p=${t#//}; [[ $p == *:* ]] && p=${p/://} || p=$p/${p##*/}
      cp "bazel-bin/$p" "$d/"
    done
    run_from "$d" ;;
  *) echo "usage: $0 [--stage DIR | --from DIR]" >&2; exit 2 ;;
esac
