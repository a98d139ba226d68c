#!/usr/bin/env bash
# Runs inside the VM of tests/bench/mpi_vm_bench.sh (a benchmark, not a
# test): MPI ping-pong (tests/mpi/mpi_check.c --bench) between two ranks,
# each on its own emulated e1000e on the VM's QEMU hub, two ways:
#   ufab  NIC 1 and NIC 2 (00:02.0, 00:03.0) bound to vfio-pci, driven by
#         ufab's soft-RoCE (10.0.0.1, 10.0.0.2); Open MPI's pml cm, mtl ofi,
#         "ufab;ofi_rxm" (docs/fabric.md)
#   ufab9k the same with FI_UFAB_PARAMS=mtu=9000: both e1000e at MTU 9000
#         (jumbo frames, docs/drivers/e1000e.md), soft-RoCE at path MTU 4096
#   tcp   NIC 3 and NIC 4 (00:04.0, 00:05.0) with the kernel's e1000e
#         driver, each in its own network namespace (fab_a: 10.0.2.1,
#         fab_b: 10.0.2.2), so their traffic crosses the hub; Open MPI's
#         pml ob1, btl tcp,self on 10.0.2.0/24. Rank and launcher meet over
#         a veth per namespace (10.99.N.1 <-> 10.99.N.2): PMIx and ORTE's
#         out-of-band channel on 10.99.0.0/16.
# The runs alternate (ufab, tcp, ufab, tcp, ...) BENCH_REPEAT times.
# Prints progress lines ("bench: ...") and one "RESULT <json>" line per run
# (mpi_check's JSON plus "transport" and "rep").
# Environment: UFAB_BIN, BENCH_DIR (prov/libufab-fi.so, mpi_check),
# BENCH_SIZES (8,65536,1048576), BENCH_LAT_ITERS (500), BENCH_BW_WINDOWS
# (40), BENCH_REPEAT (2), BENCH_TRANSPORTS ("ufab tcp"; any of ufab,
# ufab9k, tcp).
set -uo pipefail
ufab=${UFAB_BIN:?set UFAB_BIN}
dir=${BENCH_DIR:?set BENCH_DIR}
sizes=${BENCH_SIZES:-8,65536,1048576}
lat_iters=${BENCH_LAT_ITERS:-500}
bw_windows=${BENCH_BW_WINDOWS:-40}
repeat=${BENCH_REPEAT:-2}
transports=${BENCH_TRANSPORTS:-ufab tcp}
say() { printf 'bench: %s\n' "$*"; }
die() { say "error: $*"; exit 1; }
w=$(mktemp -d)
trap 'rm -rf "$w"' EXIT
export HOME=$w OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# ------------------------------------------------------------------ setup
timeout 60 modprobe vfio-pci || die "modprobe vfio-pci"
for b in 0000:00:02.0 0000:00:03.0; do timeout 60 "$ufab" bind "$b" >/dev/null || die "ufab bind $b"; done
timeout 60 modprobe veth || die "modprobe veth"
n=0
for b in 0000:00:04.0 0000:00:05.0; do
  n=$((n + 1))
  ns=fab_$([ $n = 1 ] && echo a || echo b)
  ifn=$(ls "/sys/bus/pci/devices/$b/net" 2>/dev/null | head -n1)
  [ -n "$ifn" ] || die "no kernel interface on $b"
  ip netns add "$ns" || die "ip netns add $ns"
  ip link set "$ifn" netns "$ns" || die "moving $ifn into $ns"
  ip -n "$ns" addr add "10.0.2.$n/24" dev "$ifn" && ip -n "$ns" link set "$ifn" up && ip -n "$ns" link set lo up ||
    die "addresses in $ns"
  ip link add "mg$n" type veth peer name mgp || die "veth mg$n"
  ip link set mgp netns "$ns" && ip addr add "10.99.$n.1/24" dev "mg$n" && ip link set "mg$n" up &&
    ip -n "$ns" addr add "10.99.$n.2/24" dev mgp && ip -n "$ns" link set mgp up &&
    ip -n "$ns" route add 10.99.0.0/16 via "10.99.$n.1" || die "management veth of $ns"
done
# The kernel NICs see each other across the hub, and only there (no ping
# here: a TCP connection refused by 10.0.2.2 is an answer from fab_b).
msg=$(ip netns exec fab_a timeout 20 bash -c 'exec 3<>/dev/tcp/10.0.2.2/9' 2>&1)
grep -q "refused" <<<"$msg" || die "fab_a cannot reach 10.0.2.2 across the hub: $msg"
say "$(nproc) vCPU; ufab on 00:02.0 (10.0.0.1), 00:03.0 (10.0.0.2); kernel e1000e 00:04.0 in fab_a (10.0.2.1), 00:05.0 in fab_b (10.0.2.2)"

cat >"$w/rank.sh" <<'EOS'
#!/bin/bash
r=${OMPI_COMM_WORLD_RANK:?not started by mpirun}
export FI_UFAB_DEVICES="0000:00:0$((r + 2)).0@10.0.0.$((r + 1))"
exec "$@"
EOS
chmod +x "$w/rank.sh"
args=(--bench --sizes "$sizes" --lat-iters "$lat_iters" --bw-windows "$bw_windows" --json "$w/out.json")

# $1: device parameters for every ufab device (FI_UFAB_PARAMS), may be empty.
run_ufab() {
  FI_PROVIDER_PATH=$dir/prov FI_PROVIDER="ufab;ofi_rxm" FI_UFAB_STATS=1 FI_UFAB_PARAMS=${1:-} \
    timeout -k 10 600 mpirun --oversubscribe -np 2 -x FI_PROVIDER_PATH -x FI_PROVIDER -x FI_UFAB_STATS -x FI_UFAB_PARAMS \
    --mca pml cm --mca mtl ofi --mca mtl_ofi_provider_include "ufab;ofi_rxm" --mca btl self \
    "$w/rank.sh" "$dir/mpi_check" "${args[@]}"
}
run_tcp() {
  PMIX_MCA_ptl_tcp_remote_connections=1 PMIX_MCA_ptl_tcp_if_include=10.99.0.0/16 \
    timeout -k 10 600 mpirun --oversubscribe -x PMIX_MCA_ptl_tcp_remote_connections -x PMIX_MCA_ptl_tcp_if_include \
    --mca oob_tcp_if_include 10.99.0.0/16 --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include 10.0.2.0/24 \
    -np 1 ip netns exec fab_a "$dir/mpi_check" "${args[@]}" : -np 1 ip netns exec fab_b "$dir/mpi_check" "${args[@]}"
}

for ((rep = 1; rep <= repeat; rep++)); do
  for t in $transports; do
    rm -f "$w/out.json"
    t0=$SECONDS
    # A look at who runs during the 8-byte part (first repetition): the
    # busiest threads of the guest, 8 s into the run.
    if [ "$rep" = 1 ]; then
      (sleep 8; top -H -b -n 1 -w 120 2>/dev/null | sed -n '7,16p' | sed "s/^/bench: top ($t): /") &
    fi
    case $t in
      ufab) run_ufab "" >"$w/run.out" 2>&1 ;;
      ufab9k) run_ufab mtu=9000 >"$w/run.out" 2>&1 ;;
      tcp)
        tx0=$(ip netns exec fab_a sh -c 'cat /sys/class/net/e*/statistics/tx_packets')
        run_tcp >"$w/run.out" 2>&1
        tx1=$(ip netns exec fab_a sh -c 'cat /sys/class/net/e*/statistics/tx_packets')
        ;;
      *) die "unknown transport $t (ufab, ufab9k, tcp)" ;;
    esac
    rc=$?
    if [ "$rc" -ne 0 ] || [ ! -s "$w/out.json" ]; then
      say "run $rep $t failed (rc $rc):"
      tail -n 30 "$w/run.out" | sed 's/^/  | /'
      continue
    fi
    extra=
    case $t in
      ufab | ufab9k) extra=$(grep -h '^libufab-fi: stats' "$w/run.out" | sed 's/^libufab-fi: stats //' | tr '\n' ';') ;;
      tcp) extra="fab_a's e1000e sent $((tx1 - tx0)) frames" ;;
    esac
    say "run $rep $t ($((SECONDS - t0)) s): $(tr -d '\n' <"$w/out.json"); $extra"
    echo "RESULT $(jq -c --arg t "$t" --argjson rep "$rep" --arg note "$extra" '. + {transport: $t, rep: $rep, note: $note}' "$w/out.json")"
  done
done
