#!/usr/bin/env bash
# MPI in the VM: ping-pong latency and bandwidth between two Open MPI ranks
# on two emulated e1000e NICs of one VM, over ufab (vfio-bound NICs,
# soft-RoCE, libufab-fi.so through ofi_rxm: pml cm, mtl ofi) against Open
# MPI's own TCP transport (pml ob1, btl tcp,self) over two NICs that the
# kernel's e1000e driver drives, each in its own network namespace so the
# traffic crosses the QEMU hub. Same VM, same run, the runs alternating
# (tests/bench/mpi_vm_bench_guest.sh). A benchmark, not a test: not part
# of scripts/test.sh. Prints a table and writes BENCH_OUT.json
# (docs/bench/mpi_vm.json); docs/benchmarks.md ("libfabric and MPI in the
# VM") reads it.
#
#   bazel build //fabric:libufab-fi.so //tools/ufab
#   tests/bench/mpi_vm_bench.sh
#
# Environment: BENCH_OUT (docs/bench/mpi_vm), BENCH_SIZES (8,65536,1048576),
# BENCH_LAT_ITERS (500 round trips below 64 KiB, a tenth from 64 KiB),
# BENCH_BW_WINDOWS (40 windows of 16 sends below 64 KiB, 10 from 64 KiB,
# 2 from 1 MiB), BENCH_REPEAT (2), BENCH_TRANSPORTS ("ufab tcp"; ufab9k
# is ufab with FI_UFAB_PARAMS=mtu=9000: jumbo frames, path MTU 4096),
# BENCH_SMP (2: one vCPU per rank), BENCH_PROVIDER_SO (another
# libufab-fi.so to measure, for before/after comparisons).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
t_start=$SECONDS
cmdline="tests/bench/mpi_vm_bench.sh $*"
out=${BENCH_OUT:-docs/bench/mpi_vm}
smp=${BENCH_SMP:-2}
ufab=$PWD/bazel-bin/tools/ufab/ufab
so=${BENCH_PROVIDER_SO:-$PWD/bazel-bin/fabric/libufab-fi.so}
say() { printf 'mpi_vm_bench: %s\n' "$*"; }
[ -x "$ufab" ] && [ -f "$so" ] || { say "build first: bazel build //fabric:libufab-fi.so //tools/ufab"; exit 1; }
for t in mpicc mpirun jq; do command -v "$t" >/dev/null || { say "$t missing (scripts/setup.sh installs it)"; exit 1; }; done
stage=$(mktemp -d /var/tmp/mpi_vm_bench.XXXXXX)
trap 'rm -rf -- "$stage"' EXIT
mkdir -p "$stage/prov"
cp "$so" "$stage/prov/libufab-fi.so"
mpicc -O2 -o "$stage/mpi_check" tests/mpi/mpi_check.c || { say "mpicc tests/mpi/mpi_check.c failed"; exit 1; }
load_before=$(cut -d' ' -f1-3 /proc/loadavg)

envs=(--env "UFAB_BIN=$ufab" --env "BENCH_DIR=$stage")
for v in BENCH_SIZES BENCH_LAT_ITERS BENCH_BW_WINDOWS BENCH_REPEAT BENCH_TRANSPORTS; do
  [ -z "${!v:-}" ] || envs+=(--env "$v=${!v}")
done
tests/vm/run-vm --timeout 3000 --mem 2048 --smp "$smp" --nic e1000e --nic e1000e --nic e1000e --nic e1000e "${envs[@]}" \
  -- tests/bench/mpi_vm_bench_guest.sh 2>&1 | tee "$stage/vm.out"
rc=${PIPESTATUS[0]}
sed -n 's/^RESULT //p' "$stage/vm.out" >"$stage/results.jsonl"
[ -s "$stage/results.jsonl" ] || { say "no results (run-vm exited with $rc)"; exit 1; }

mkdir -p "$(dirname "$out")"
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
git diff --quiet HEAD -- 2>/dev/null || commit="$commit+changes"
# The provider measured: the tree's build, or BENCH_PROVIDER_SO's library
# (then the commit above is not the provider's: its path and hash say which).
provider="bazel-bin/fabric/libufab-fi.so of this commit"
[ -n "${BENCH_PROVIDER_SO:-}" ] && provider="$so (sha256 $(sha256sum "$so" | cut -c1-16))"
jq -n --arg cmd "$cmdline" --arg date "$(date -u +%FT%TZ)" --arg commit "$commit" --arg provider "$provider" \
  --arg qemu "$(qemu-system-x86_64 --version | head -n1)" \
  --arg guest "$(basename "$(cat "${UFAB_VM_CACHE:-$HOME/.cache/ufab/vm}/kernel" 2>/dev/null)" | sed 's/^kernel-//')" \
  --arg host "$(uname -r)" --argjson cpus "$(nproc)" --arg load_before "$load_before" \
  --arg load_after "$(cut -d' ' -f1-3 /proc/loadavg)" --argjson smp "$smp" \
  --arg ompi "$(ompi_info --version 2>/dev/null | head -n1)" --arg fabric "$(fi_info --version 2>/dev/null | tr '\n' ' ')" \
  --argjson secs $((SECONDS - t_start)) --slurpfile runs "$stage/results.jsonl" \
  '{command: $cmd, date: $date, commit: $commit, provider_library: $provider, seconds: $secs,
    host: {kernel: $host, cpus: $cpus, load_before: $load_before, load_after: $load_after},
    qemu: $qemu, accel: "tcg", guest_kernel: $guest, vm_smp: $smp, nic: "e1000e", open_mpi: $ompi, libfabric: $fabric,
    transports: {ufab: "pml cm, mtl ofi, ufab;ofi_rxm over two vfio-bound e1000e (soft-RoCE)",
                 ufab9k: "the same, FI_UFAB_PARAMS=mtu=9000 (e1000e jumbo frames, path MTU 4096)",
                 tcp: "pml ob1, btl tcp,self over two kernel-driven e1000e, one network namespace each"},
    runs: $runs}' >"$out.json"

# The table: per size and transport, the median of the runs (and their
# range) of the mean latency, of the typical latency (a run's median round
# trip, which a descheduled vCPU moves less) and of the bandwidth.
echo
printf '%-9s %-6s %24s %24s %22s\n' bytes stack "latency[us] (range)" "typical[us] (range)" "bw[MiB/s] (range)"
jq -r 'def med: sort | if length % 2 == 1 then .[length / 2 | floor] else (.[length / 2 - 1] + .[length / 2]) / 2 end;
  .runs | map(.transport as $t | .results[] | . + {transport: $t}) | group_by(.size)[] |
  group_by(.transport)[] | [.[0].size, .[0].transport,
    (map(.latency_usec) | med), (map(.latency_usec) | min), (map(.latency_usec) | max),
    (map(.latency_typical_usec // .latency_usec) | med), (map(.latency_typical_usec // .latency_usec) | min),
    (map(.latency_typical_usec // .latency_usec) | max),
    (map(.bw_mib_s) | med), (map(.bw_mib_s) | min), (map(.bw_mib_s) | max)] | @tsv' "$out.json" |
  while IFS=$'\t' read -r size t lm l0 l1 tm t0 t1 bm b0 b1; do
    printf '%-9s %-6s %8.0f (%6.0f..%6.0f) %8.0f (%6.0f..%6.0f) %7.2f (%5.2f..%5.2f)\n' "$size" "$t" "$lm" "$l0" "$l1" "$tm" "$t0" "$t1" "$bm" "$b0" "$b1"
  done
say "written: $out.json ($((SECONDS - t_start)) s)"
[ "$rc" -eq 0 ]
