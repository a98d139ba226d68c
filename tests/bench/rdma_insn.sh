#!/usr/bin/env bash
# Instructions per message of soft-RoCE, one thread driving both ends over
# swnic (tests/bench/rdma_insn_bench.cc), counted by callgrind. Prints a table
# and writes docs/bench/rdma_insn.json (or the file given with --json).
#
#   tests/bench/rdma_insn.sh [--n N] [--json FILE] [--label TEXT]
#
# Per side: the inclusive instructions of that side's calls (A: post_send and
# polling its CQ, which drives its progress; B: progress, and for SENDs
# post_recv and polling) divided by N, after a warm-up. Also per message:
# calls to clock_gettime, to malloc/operator new, and system calls made
# through syscall() (swnic's futex wake-ups). Under valgrind
# clock_gettime is a system call, so its instructions do not show in the
# count: the call count is what to read.
set -euo pipefail
cd "$(dirname "$0")/../.."
n=20000
json=docs/bench/rdma_insn.json
label="$(git rev-parse --short HEAD)$(git diff --quiet -- core drivers/swnic || echo +changes)"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --n) n="$2"; shift 2 ;;
    --json) json="$2"; shift 2 ;;
    --label) label="$2"; shift 2 ;;
    *) echo "usage: $0 [--n N] [--json FILE] [--label TEXT]" >&2; exit 2 ;;
  esac
done
command -v valgrind >/dev/null || { echo "rdma_insn.sh: valgrind is not installed" >&2; exit 1; }
bazel build //tests/bench:rdma_insn_bench >/dev/null 2>&1 || bazel build //tests/bench:rdma_insn_bench
bin=bazel-bin/tests/bench/rdma_insn_bench
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for mode in "write 16" "write 1" "send 16" "send 1"; do
  set -- $mode
  out="$tmp/cg.$1.$2"
  if ! valgrind --tool=callgrind --instr-atstart=no --toggle-collect=insn_measured --callgrind-out-file="$out" \
      "$bin" --op "$1" --batch "$2" --n "$n" --warmup 1600 >"$tmp/log.$1.$2" 2>&1; then
    cat "$tmp/log.$1.$2" >&2
    exit 1
  fi
done
python3 - "$tmp" "$n" "$json" "$label" <<'PY'
import json, re, sys, collections
tmp, n, out, label = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]

def parse(path):
    """Inclusive cost of the insn_* functions and call counts per callee."""
    names = {}
    def name(tok):
        m = re.match(r'\((\d+)\)(?:\s+(.*))?', tok)
        if not m:
            return tok
        if m.group(2):
            names[m.group(1)] = m.group(2)
        return names.get(m.group(1), tok)
    calls = collections.Counter()
    incl = collections.Counter()
    fn = cfn = None
    pending = None
    with open(path) as f:
        for line in f:
            line = line.rstrip('\n')
            if line.startswith('fn='):
                fn = name(line[3:])
            elif line.startswith('cfn='):
                cfn = name(line[4:])
            elif line.startswith('calls='):
                pending = int(line[6:].split()[0])
            elif pending is not None and line and (line[0].isdigit() or line[0] in '+-*'):
                cost = int(line.split()[1]) if len(line.split()) > 1 else 0
                calls[cfn] += pending
                if fn == 'insn_run' and cfn.startswith('insn_'):
                    incl[cfn] += cost
                pending = None
    return incl, calls

def per(calls, pat):
    return sum(c for k, c in calls.items() if re.search(pat, k)) / n

rows = []
for op in ('write', 'send'):
    for batch in (16, 1):
        incl, calls = parse(f'{tmp}/cg.{op}.{batch}')
        a = (incl['insn_a_post'] + incl['insn_a_poll']) / n
        b = (incl['insn_b_round'] + incl['insn_b_post_recv']) / n
        rows.append({
            'op': op, 'bytes': 64 if op == 'write' else 8, 'batch': batch,
            'insn_per_msg_a': round(a), 'insn_per_msg_b': round(b), 'insn_per_msg_total': round(a + b),
            'clock_gettime_per_msg': round(per(calls, r'clock_gettime'), 3),
            'syscall_per_msg': round(per(calls, r'^\S*:syscall$|^syscall$'), 3),
            'malloc_per_msg': round(per(calls, r'(^|:)malloc$'), 3),
        })
print(f'soft-RoCE over swnic, one thread, callgrind, N={n} per mode ({label})')
hdr = f"{'op':<6} {'bytes':>5} {'batch':>5} {'insn/msg A':>11} {'insn/msg B':>11} {'total':>8} {'clock/msg':>10} {'syscall()/msg':>14} {'malloc/msg':>11}"
print(hdr)
for r in rows:
    print(f"{r['op']:<6} {r['bytes']:>5} {r['batch']:>5} {r['insn_per_msg_a']:>11} {r['insn_per_msg_b']:>11} "
          f"{r['insn_per_msg_total']:>8} {r['clock_gettime_per_msg']:>10} {r['syscall_per_msg']:>14} "
          f"{r['malloc_per_msg']:>11}")
try:
    with open(out) as f:
        doc = json.load(f)
except (OSError, ValueError):
    doc = {'description': 'soft-RoCE instructions per message per side, one thread, swnic loopback, '
                          'callgrind (tests/bench/rdma_insn.sh)', 'runs': []}
doc['runs'] = [r for r in doc['runs'] if r.get('label') != label]
doc['runs'].append({'label': label, 'n': n, 'rows': rows})
with open(out, 'w') as f:
    json.dump(doc, f, indent=2)
    f.write('\n')
print(f'written to {out}')
PY
