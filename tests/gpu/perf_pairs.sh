#!/usr/bin/env bash
# Part of the GPU suite (tests/gpu/run.sh): `ufab perf` between two
# processes over swnic with GPU buffers (--use_cuda) on one side, the
# other or both, every byte of every message checked where it lands
# (--data_validation): WRITE (write-bw), READ (read-bw), SEND (send-bw) at
# 1 B, 4097 B, 1 MiB and (GPU on both sides) 64 MiB; the same with 2%
# loss on the link; and read-lat/send-lat with GPU buffers. Then the same
# over the shm provider (two processes on one shm domain; GPU memory moved
# by its owner through its staging pool, docs/gpu.md "shm"), without the
# loss pairs (shm has no link to lose frames on). Prints one line per pair
# and "perf pairs: N passed, M failed"; exit 1 on any failure.
#
#   tests/gpu/perf_pairs.sh UFAB_BINARY
set -uo pipefail
ufab=${1:?usage: $0 UFAB_BINARY}
tmp=$(mktemp -d)
link=pp$$
server=
cleanup() {
  if [ -n "$server" ]; then kill "$server" 2>/dev/null; wait "$server" 2>/dev/null; fi
  rm -rf "$tmp"
  rm -f /dev/shm/ufab-swnic-"$link"*
}
trap cleanup EXIT
passed=0 failed=0

# pair TEST "SERVER OPTS" "CLIENT OPTS" NAME [swnic|shm]
pair() {
  local test=$1 sopts=$2 copts=$3 name=$4 port=
  local sdev=("swnic:$link:0" --ip 10.0.0.1) cdev=("swnic:$link:1" --ip 10.0.0.2)
  if [ "${5:-}" = shm ]; then sdev=("shm:$link"); cdev=("shm:$link"); fi
  # The old logs go first: the server's redirection truncates s.err only
  # once it runs, and the port loop below must not read the last pair's port.
  rm -f /dev/shm/ufab-swnic-"$link"* "$tmp"/s.* "$tmp"/c.*
  # shellcheck disable=SC2086
  timeout 300 "$ufab" perf "$test" "${sdev[@]}" -p 0 --json --timeout 20 $sopts \
    >"$tmp/s.out" 2>"$tmp/s.err" &
  server=$!
  for _ in $(seq 400); do
    port=$(sed -n 's/.*waiting for a client on TCP port \([0-9][0-9]*\).*/\1/p' "$tmp/s.err")
    if [ -n "$port" ] || ! kill -0 "$server" 2>/dev/null; then break; fi
    sleep 0.05
  done
  local crc=1 src=1
  if [ -n "$port" ]; then
    # shellcheck disable=SC2086
    timeout 300 "$ufab" perf "$test" "${cdev[@]}" -p "$port" --json --timeout 20 $copts 127.0.0.1 \
      >"$tmp/c.out" 2>"$tmp/c.err"
    crc=$?
  fi
  wait "$server"; src=$?; server=
  local checked
  checked=$(cat "$tmp/s.out" "$tmp/c.out" 2>/dev/null | grep -o '"validated_bytes":[0-9][0-9]*' | cut -d: -f2 | head -n 1)
  if [ "$src" -eq 0 ] && [ "$crc" -eq 0 ]; then
    passed=$((passed + 1)); echo "PASS $name (validated $checked bytes)"
  else
    failed=$((failed + 1)); echo "FAIL $name (server $src, client $crc)"
    tail -n 3 "$tmp/s.err" "$tmp/c.err" | sed 's/^/  | /'
  fi
}

# Over swnic (with 2% loss pairs), then over the shm provider (no link to
# lose frames on). write-lat is not here: it polls arriving bytes from the
# CPU, which --use_cuda refuses (as perftest does).
for dev in swnic shm; do
  label=""; [ "$dev" = shm ] && label="shm "
  for test in write-bw read-bw send-bw; do
    for sides in "gpu host" "host gpu" "gpu gpu"; do
      read -r s c <<<"$sides"
      so=""; co=""
      [ "$s" = gpu ] && so="--use_cuda"
      [ "$c" = gpu ] && co="--use_cuda"
      sizes="1 4097 1048576"
      [ "$sides" = "gpu gpu" ] && sizes="$sizes 67108864"
      for size in $sizes; do
        n=$(( size >= 67108864 ? 8 : size >= 1048576 ? 50 : 300 ))
        common="--data_validation -s $size -n $n"
        pair "$test" "$common $so" "$common $co" "$label$test server $s, client $c, $size B" "$dev"
      done
      if [ "$dev" = swnic ]; then
        common="--data_validation -s 65536 -n 200 --param loss=0.02"
        pair "$test" "$common $so" "$common $co" "$test server $s, client $c, 64 KiB, 2% loss" "$dev"
      fi
    done
  done
  for test in read-lat send-lat; do
    pair "$test" "--use_cuda -s 4096 -n 200" "--use_cuda -s 4096 -n 200" "$label$test GPU both sides, 4 KiB" "$dev"
  done
done
echo "perf pairs: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
