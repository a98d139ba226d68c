#!/usr/bin/env bash
# Power-loss durability (issue 13; docs/persistence.md): committed WRITEs
# survive the loss of the target's volatile layer, uncommitted ones do not.
#
# Each kill: a fresh sparse disk image on the host, a VM (tests/vm/run-vm
# --disk) whose guest makes its page cache the volatile layer
# (vm.dirty_writeback_centisecs=0, a day for dirty_expire, dirty ratios of
# 90/95 %: nothing is written back on its own), a ufab target that maps the
# disk (/dev/vda) MAP_SHARED and registers it as durable memory, and a ufab
# initiator that writes 4 KiB blocks into it over swnic, alternating
# committed blocks (a WRITE with UFAB_SEND_COMMIT: on the wire the WRITE and
# a FLUSH PERSISTENT of its range, which the target answers once it msynced
# the range to the disk) and control blocks (WRITE, then FLUSH GLOBAL only),
# printing each block once it completed. After a random
# number of completed blocks and a random delay, QEMU gets SIGKILL. Then, on
# the host, `power_loss check`: every committed block must be in the image
# byte for byte; control blocks are expected missing, and a kill after which
# all control blocks are present fails as proving nothing.
#
#   tests/bench/power_loss.sh [--kills N] [--json FILE] [--size MIB]
#                             [--min-blocks K] [--max-blocks K] [--control-only]
#                             [--commit-style flag|flush] [--keep DIR]
#
#   --kills N         VMs to kill (default 3)
#   --json FILE       write the per-kill figures and the totals as JSON
#   --size MIB        disk image size (default 32: 4096 blocks per area)
#   --min-blocks K, --max-blocks K
#                     the kill comes after K completed blocks (committed and
#                     control counted together), K uniform in [min, max]
#                     (default 4 and 80), plus 0 to 500 ms
#   --control-only    no durable target: control blocks only (tests the
#                     kill and the check without FLUSH PERSISTENT)
#   --commit-style S  flag: WRITE with UFAB_SEND_COMMIT (default); flush: a
#                     WRITE and then a FLUSH PERSISTENT posted by the initiator
#   --keep DIR        keep each kill's image and logs under DIR (default:
#                     only a failed kill's are kept, under $PWD/power_loss-failed)
#
# UFAB_PL_WRITEBACK_CS sets the guest's vm.dirty_writeback_centisecs
# (default 8640000, a day; 0 lets the guest write some control blocks back
# on its own, see docs/persistence.md).
#
# Prints a row per kill and a totals line ("power_loss: kills N, committed
# C, lost L, control K, control present P, failed F"); exits 1 if any kill
# failed. Under TCG a kill takes about 15 to 30 s (boot included).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
repo=$PWD

kills=3 json='' size=32 min_blocks=4 max_blocks=80 control_only=0 keep='' style=flag
die() { echo "power_loss: $*" >&2; exit 2; }
while (($#)); do
  case $1 in
    --kills) kills=${2:?}; shift 2 ;;
    --json) json=${2:?}; shift 2 ;;
    --size) size=${2:?}; shift 2 ;;
    --min-blocks) min_blocks=${2:?}; shift 2 ;;
    --max-blocks) max_blocks=${2:?}; shift 2 ;;
    --control-only) control_only=1; shift ;;
    --commit-style) style=${2:?}; shift 2 ;;
    --keep) keep=${2:?}; shift 2 ;;
    -h|--help) sed -n '2,45p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
done
for v in kills size min_blocks max_blocks; do
  [[ ${!v} =~ ^[0-9]+$ ]] || die "--${v//_/-} '${!v}' is not a whole number"
done
((kills >= 1 && size >= 1 && size <= 2048 && min_blocks >= 2 && max_blocks >= min_blocks)) ||
  die "need --kills >= 1, --size 1..2048, --min-blocks >= 2, --max-blocks >= --min-blocks"
[[ $style == flag || $style == flush ]] || die "--commit-style '$style': flag or flush"
# Room for the largest K in either area, so the initiator never runs out
# before the kill (an idle guest is fine, but the kill should find work).
((max_blocks / 2 + 1 < size * 1024 / 4 / 2)) || die "--max-blocks $max_blocks does not fit a ${size} MiB disk"

bazel build //tests/vm/cases:power_loss >/dev/null 2>&1 || bazel build //tests/vm/cases:power_loss || exit 2
prog=$repo/bazel-bin/tests/vm/cases/power_loss
[[ -x $prog ]] || die "$prog is missing after the build"

# The images and logs: only the host opens them (QEMU the image), so any
# scratch directory does.
scratch=$(mktemp -d "${TMPDIR:-/tmp}/power_loss.XXXXXX") || die "cannot make a scratch dir"
trap 'rm -rf -- "$scratch"' EXIT
failed_dir=${keep:-$repo/power_loss-failed}

co_flag=
((control_only)) && co_flag=--control-only
vm_seconds=300  # guest programs' own bound; the kill comes long before
writeback_cs=${UFAB_PL_WRITEBACK_CS:-8640000}

rows=() total_committed=0 total_lost=0 total_control=0 total_present=0 failures=0
printf '%-5s %-20s %5s %10s %5s %8s %8s %6s %s\n' kill seed after committed lost control present vm_s verdict
for ((k = 1; k <= kills; k++)); do
  dir=$scratch/kill-$k
  mkdir -p "$dir"
  img=$dir/disk.img
  truncate -s "${size}M" "$img" || die "cannot create $img"
  seed=$(((SRANDOM << 31) ^ SRANDOM))
  after=$((min_blocks + SRANDOM % (max_blocks - min_blocks + 1)))
  delay_ms=$((SRANDOM % 501))
  guest=$(cat <<GUEST
sysctl -q -w vm.dirty_writeback_centisecs=$writeback_cs vm.dirty_expire_centisecs=8640000 \
  vm.dirty_background_ratio=90 vm.dirty_ratio=95 || exit 1
echo "power_loss: guest: disk \$UFAB_VM_DISK1, dirty_writeback_centisecs \$(cat /proc/sys/vm/dirty_writeback_centisecs)," \
  "dirty_expire_centisecs \$(cat /proc/sys/vm/dirty_expire_centisecs), dirty_background_ratio" \
  "\$(cat /proc/sys/vm/dirty_background_ratio), dirty_ratio \$(cat /proc/sys/vm/dirty_ratio)"
[ -b "\$UFAB_VM_DISK1" ] || { echo "power_loss: no disk in the guest" >&2; exit 1; }
$prog target --map "\$UFAB_VM_DISK1" --seconds $vm_seconds $co_flag & t=\$!
$prog initiator --seed $seed --seconds $vm_seconds --commit-style $style $co_flag & i=\$!
# Both run until the kill; one that ends early failed: stop the other.
wait -n \$t \$i; rc=\$?
kill \$t \$i 2>/dev/null; wait
echo "power_loss: guest: a program ended before the kill (status \$rc)" >&2
exit 1
GUEST
)
  : >"$dir/out.log"  # polled below, maybe before run-vm's redirection made it
  start=$EPOCHSECONDS
  tests/vm/run-vm --quiet --timeout $((vm_seconds + 120)) --disk "$img" \
    --qemu-arg -pidfile --qemu-arg "$dir/qemu.pid" -- bash -c "$guest" >"$dir/out.log" 2>"$dir/err.log" &
  vm=$!
  # Wait for `after` completed blocks (bounded), then the random delay,
  # then SIGKILL to QEMU (not run-vm: it must see QEMU die, as on a crash).
  why=
  limit=$(($(date +%s) + vm_seconds))
  while :; do
    n=$(grep -cE '^power_loss: (committed|control) block [0-9]+$' "$dir/out.log" 2>/dev/null)
    ((n >= after)) && break
    if ! kill -0 "$vm" 2>/dev/null; then why="the VM ended before $after blocks ($n completed)"; break; fi
    if (($(date +%s) >= limit)); then why="only $n of $after blocks within $vm_seconds s"; break; fi
    sleep 0.1
  done
  if [[ -z $why ]]; then
    sleep "$(printf '0.%03d' "$delay_ms")"
    qpid=$(cat "$dir/qemu.pid" 2>/dev/null)
    if [[ $qpid =~ ^[0-9]+$ ]] && [[ $(cat "/proc/$qpid/comm" 2>/dev/null) == qemu* ]]; then
      kill -KILL "$qpid"
    else
      why="no QEMU process behind $dir/qemu.pid ('$qpid')"
    fi
  fi
  # run-vm notices QEMU's end within 0.1 s; bound the wait anyway.
  for _ in $(seq 300); do kill -0 "$vm" 2>/dev/null || break; sleep 0.1; done
  kill "$vm" 2>/dev/null
  wait "$vm" 2>/dev/null
  vm_s=$((EPOCHSECONDS - start))

  if [[ -n $why ]]; then
    verdict=ERROR committed=0 lost=0 control=0 present=0
    echo "power_loss: kill $k: $why; the guest said:" >&2
    tail -n 8 "$dir/out.log" "$dir/err.log" | sed 's/^/  | /' >&2
  else
    "$prog" check --image "$img" --log "$dir/out.log" >"$dir/check.log" 2>&1
    line=$(grep '^power_loss: result ' "$dir/check.log" | tail -n1)
    if [[ $line =~ committed=([0-9]+)\ lost=([0-9]+)\ control=([0-9]+)\ control_present=([0-9]+)\ (PASS|FAIL) ]]; then
      committed=${BASH_REMATCH[1]} lost=${BASH_REMATCH[2]} control=${BASH_REMATCH[3]}
      present=${BASH_REMATCH[4]} verdict=${BASH_REMATCH[5]}
    else
      verdict=ERROR committed=0 lost=0 control=0 present=0
    fi
    [[ $verdict == PASS ]] || sed 's/^/  | /' "$dir/check.log" >&2
  fi
  printf '%-5s %-20s %5s %10s %5s %8s %8s %6s %s\n' "$k" "$seed" "$after" "$committed" "$lost" "$control" \
    "$present" "$vm_s" "$verdict"
  total_committed=$((total_committed + committed)) total_lost=$((total_lost + lost))
  total_control=$((total_control + control)) total_present=$((total_present + present))
  rows+=("{\"kill\": $k, \"seed\": $seed, \"kill_after_blocks\": $after, \"delay_ms\": $delay_ms, \"committed\": $committed, \"lost\": $lost, \"control\": $control, \"control_present\": $present, \"vm_seconds\": $vm_s, \"verdict\": \"$verdict\"}")
  if [[ $verdict != PASS ]]; then
    failures=$((failures + 1))
    mkdir -p "$failed_dir" && cp -r "$dir" "$failed_dir/kill-$k-$seed" &&
      echo "power_loss: kill $k's image and logs kept in $failed_dir/kill-$k-$seed" >&2
  elif [[ -n $keep ]]; then
    mkdir -p "$keep" && cp -r "$dir" "$keep/kill-$k-$seed"
  fi
  rm -rf -- "$dir"
done

echo "power_loss: kills $kills, committed $total_committed, lost $total_lost, control $total_control," \
  "control present $total_present, failed $failures"
if [[ -n $json ]]; then
  {
    printf '{\n  "kills": %s, "committed": %s, "lost": %s, "control": %s, "control_present": %s, "failed": %s,\n' \
      "$kills" "$total_committed" "$total_lost" "$total_control" "$total_present" "$failures"
    printf '  "control_only": %s, "commit_style": "%s", "size_mib": %s, "min_blocks": %s, "max_blocks": %s,\n' \
      "$([[ $control_only == 1 ]] && echo true || echo false)" "$style" "$size" "$min_blocks" "$max_blocks"
    printf '  "runs": [\n'
    for ((i = 0; i < ${#rows[@]}; i++)); do
      printf '    %s%s\n' "${rows[i]}" "$([[ $i -lt $((${#rows[@]} - 1)) ]] && echo ,)"
    done
    printf '  ]\n}\n'
  } >"$json" || die "cannot write $json"
fi
((failures == 0))
