#!/usr/bin/env python3
"""Writes the seed corpus for roce_parse_fuzzer into corpus/roce_parse/.

Valid frames come from the independent Python builder in
tests/unit/roce/make_vectors.py (zlib ICRC); invalid ones are those frames
with one thing wrong, one file per parser rejection reason where a byte
edit can provoke it. Deterministic: rerunning rewrites the same bytes.

    python3 tests/fuzz/make_corpus.py
"""

import os
import random
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "unit", "roce"))
import make_vectors as mv  # noqa: E402

OUT = os.path.join(HERE, "corpus", "roce_parse")


def fix(frame):
    """Recomputes the IPv4 checksum and the ICRC after an edit (lengths as stored)."""
    f = bytearray(frame)
    f[24:26] = b"\0\0"
    f[24:26] = struct.pack("!H", mv.ones_complement_checksum(bytes(f[14:34])))
    total = struct.unpack("!H", f[16:18])[0]
    if total >= 44 and 14 + total <= len(f):
        end = 14 + total - 4
        crc = mv.icrc(bytes(f[14:34]), bytes(f[34:42]), bytes(f[42:54]), bytes(f[54:end]))
        f[end:end + 4] = struct.pack("<I", crc)
    return bytes(f)


def set_roce_len(frame, n):
    """UDP payload (BTH .. ICRC) of exactly n bytes, lengths and checksums consistent."""
    f = bytearray(frame[:42 + n].ljust(42 + n, b"\0"))
    f[16:18] = struct.pack("!H", 28 + n)
    f[38:40] = struct.pack("!H", 8 + n)
    return fix(bytes(f))


def main():
    rng = random.Random(18515)
    os.makedirs(OUT, exist_ok=True)
    for name in os.listdir(OUT):
        os.unlink(os.path.join(OUT, name))
    seeds = {}

    def valid(opcode, plen):
        f = mv.random_fields(rng, opcode)
        return mv.build_frame(f, bytes(rng.randrange(256) for _ in range(plen)))[0]

    # Valid: one per header layout, and the pad values.
    for opcode, plen in [(0x04, 0), (0x04, 1), (0x04, 2), (0x04, 3), (0x00, 256), (0x01, 256), (0x03, 5),
                         (0x06, 64), (0x0B, 9), (0x0C, 0), (0x0D, 128), (0x0E, 128), (0x10, 0), (0x11, 0),
                         (0x12, 0), (0x13, 0), (0x14, 0), (0x17, 6), (0x1C, 0), (0x1D, 8), (0x25, 7),
                         (0x2A, 32), (0x64, 40), (0x65, 3)]:
        seeds["valid_%s_%d" % (mv.OPCODES[opcode][0].lower(), plen)] = valid(opcode, plen)

    base = valid(0x04, 37)
    ack = valid(0x11, 0)
    b = bytearray(base)
    # Minimum-size padding (accepted) and invalid variants.
    seeds["valid_padded_to_60"] = valid(0x04, 0) + b"\0\0"
    seeds["bad_truncated_ethernet"] = base[:10]
    seeds["bad_not_ipv4_vlan"] = base[:12] + b"\x81\x00" + base[14:]
    seeds["bad_truncated_ipv4"] = base[:30]
    seeds["bad_ipv4_version"] = fix(base[:14] + b"\x65" + base[15:])
    seeds["bad_ipv4_options"] = fix(base[:14] + b"\x46" + base[15:])
    seeds["bad_ipv4_length_exceeds"] = fix(base[:16] + struct.pack("!H", len(base) - 13) + base[18:])
    seeds["bad_trailing_bytes"] = base + b"\0"
    seeds["bad_ipv4_fragment"] = fix(base[:20] + b"\x20" + base[21:])
    seeds["bad_not_udp"] = fix(base[:23] + b"\x06" + base[24:])
    seeds["bad_ipv4_checksum"] = base[:24] + bytes([base[24] ^ 1]) + base[25:]
    seeds["bad_udp_length"] = base[:38] + struct.pack("!H", len(base) - 33) + base[40:]
    seeds["bad_not_roce_port"] = base[:36] + struct.pack("!H", 4792) + base[38:]
    seeds["bad_udp_checksum"] = base[:40] + b"\x12\x34" + base[42:]
    seeds["bad_truncated_bth"] = set_roce_len(base, 11)
    seeds["bad_tver"] = fix(base[:43] + bytes([base[43] | 1]) + base[44:])
    seeds["bad_unknown_opcode_rd"] = fix(base[:42] + b"\x40" + base[43:])
    seeds["bad_unknown_opcode_cnp"] = fix(base[:42] + b"\x81" + base[43:])
    seeds["bad_truncated_reth"] = set_roce_len(valid(0x0A, 16), 12 + 15)
    seeds["bad_truncated_icrc"] = set_roce_len(base, 12 + 3)
    seeds["bad_pad_exceeds"] = fix(valid(0x04, 0)[:43] + b"\x10" + valid(0x04, 0)[44:])
    seeds["bad_misaligned"] = set_roce_len(valid(0x04, 4), 12 + 5 + 4)
    seeds["bad_payload_on_ack"] = set_roce_len(ack, 12 + 4 + 4 + 4)
    b[-1] ^= 0x80
    seeds["bad_icrc"] = bytes(b)

    # FLUSH with every placement type and selectivity rxe sends (FETH as
    # its feth_init writes it), one with the reserved FETH bits set (read
    # as zero), and ATOMIC_WRITE / FLUSH cut or carrying the wrong payload.
    # Drawn after everything above, so the earlier seeds keep their bytes.
    for plt in (1, 2, 3):
        for sel in (0, 1):
            f = mv.random_fields(rng, 0x1C)
            f["feth"] = sel << 4 | plt
            seeds["valid_rc_flush_type%d_sel%d" % (plt, sel)] = mv.build_frame(f, b"")[0]
    f = mv.random_fields(rng, 0x1C)
    f["feth"] = 0xFFFFFFC1
    seeds["valid_rc_flush_reserved_bits"] = mv.build_frame(f, b"")[0]
    flush = valid(0x1C, 0)
    seeds["bad_truncated_feth"] = set_roce_len(flush, 12 + 3)
    seeds["bad_truncated_flush_reth"] = set_roce_len(flush, 12 + 4 + 15)
    seeds["bad_payload_on_flush"] = set_roce_len(flush + b"\0" * 8, 12 + 4 + 16 + 8 + 4)
    aw = valid(0x1D, 8)
    seeds["bad_atomic_write_4_bytes"] = set_roce_len(aw, 12 + 16 + 4 + 4)
    seeds["bad_atomic_write_12_bytes"] = set_roce_len(aw + b"\0" * 4, 12 + 16 + 12 + 4)

    for name, data in sorted(seeds.items()):
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(data)
    print("wrote %d seeds to %s" % (len(seeds), os.path.relpath(OUT)))


if __name__ == "__main__":
    main()
