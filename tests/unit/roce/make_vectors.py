#!/usr/bin/env python3
"""Known-answer vectors for ufab's RoCEv2 ICRC, parser and builder.

An implementation independent of the C++ one: frames are packed with
`struct` and the ICRC is Python's zlib.crc32 over

    8 x 0xFF | IPv4 header (TOS, TTL, checksum = 0xFF, 0xFF, 0xFFFF)
    | UDP header (checksum = 0xFFFF) | BTH (byte 4 = 0xFF)
    | extension headers | payload | pad

stored little-endian after the pad, which is what Linux rxe computes
(drivers/infiniband/sw/rxe/rxe_icrc.c). For a FLUSH (0x1C) rxe's CRC
covers the BTH (as on the wire), FETH and RETH once more after that: its
opcode table has no payload offset for FLUSH (core/roce/icrc.h).

Regenerate the committed C++ include with:

    python3 tests/unit/roce/make_vectors.py > tests/unit/roce/icrc_vectors.inc

The output is deterministic (fixed seed), so regenerating without changing
this script changes nothing. tests/fuzz/make_corpus.py imports build_frame.
"""

import random
import struct
import sys
import zlib

# Extension headers in wire order with their sizes (IBA 9.3; FETH from the
# memory placement extensions as rxe 6.2 lays it out).
DETH, FETH, RETH, ATOMIC_ETH, AETH, ATOMIC_ACK, IMMDT, IETH = (
    "deth", "feth", "reth", "atomic_eth", "aeth", "atomic_ack", "immdt", "ieth")
WIRE_ORDER = [DETH, FETH, RETH, ATOMIC_ETH, AETH, ATOMIC_ACK, IMMDT, IETH]

# opcode -> (name, extension headers, payload rule): every RC, UC and UD opcode.
OPCODES = {
    0x00: ("RC_SEND_FIRST", [], "any"),
    0x01: ("RC_SEND_MIDDLE", [], "any"),
    0x02: ("RC_SEND_LAST", [], "any"),
    0x03: ("RC_SEND_LAST_WITH_IMMEDIATE", [IMMDT], "any"),
    0x04: ("RC_SEND_ONLY", [], "any"),
    0x05: ("RC_SEND_ONLY_WITH_IMMEDIATE", [IMMDT], "any"),
    0x06: ("RC_RDMA_WRITE_FIRST", [RETH], "any"),
    0x07: ("RC_RDMA_WRITE_MIDDLE", [], "any"),
    0x08: ("RC_RDMA_WRITE_LAST", [], "any"),
    0x09: ("RC_RDMA_WRITE_LAST_WITH_IMMEDIATE", [IMMDT], "any"),
    0x0A: ("RC_RDMA_WRITE_ONLY", [RETH], "any"),
    0x0B: ("RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", [RETH, IMMDT], "any"),
    0x0C: ("RC_RDMA_READ_REQUEST", [RETH], "none"),
    0x0D: ("RC_RDMA_READ_RESPONSE_FIRST", [AETH], "any"),
    0x0E: ("RC_RDMA_READ_RESPONSE_MIDDLE", [], "any"),
    0x0F: ("RC_RDMA_READ_RESPONSE_LAST", [AETH], "any"),
    0x10: ("RC_RDMA_READ_RESPONSE_ONLY", [AETH], "any"),
    0x11: ("RC_ACKNOWLEDGE", [AETH], "none"),
    0x12: ("RC_ATOMIC_ACKNOWLEDGE", [AETH, ATOMIC_ACK], "none"),
    0x13: ("RC_COMPARE_SWAP", [ATOMIC_ETH], "none"),
    0x14: ("RC_FETCH_ADD", [ATOMIC_ETH], "none"),
    0x16: ("RC_SEND_LAST_WITH_INVALIDATE", [IETH], "any"),
    0x17: ("RC_SEND_ONLY_WITH_INVALIDATE", [IETH], "any"),
    0x1C: ("RC_FLUSH", [FETH, RETH], "none"),
    0x1D: ("RC_ATOMIC_WRITE", [RETH], "eight"),
    0x20: ("UC_SEND_FIRST", [], "any"),
    0x21: ("UC_SEND_MIDDLE", [], "any"),
    0x22: ("UC_SEND_LAST", [], "any"),
    0x23: ("UC_SEND_LAST_WITH_IMMEDIATE", [IMMDT], "any"),
    0x24: ("UC_SEND_ONLY", [], "any"),
    0x25: ("UC_SEND_ONLY_WITH_IMMEDIATE", [IMMDT], "any"),
    0x26: ("UC_RDMA_WRITE_FIRST", [RETH], "any"),
    0x27: ("UC_RDMA_WRITE_MIDDLE", [], "any"),
    0x28: ("UC_RDMA_WRITE_LAST", [], "any"),
    0x29: ("UC_RDMA_WRITE_LAST_WITH_IMMEDIATE", [IMMDT], "any"),
    0x2A: ("UC_RDMA_WRITE_ONLY", [RETH], "any"),
    0x2B: ("UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", [RETH, IMMDT], "any"),
    0x64: ("UD_SEND_ONLY", [DETH], "any"),
    0x65: ("UD_SEND_ONLY_WITH_IMMEDIATE", [DETH, IMMDT], "any"),
}


def ones_complement_checksum(data):
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack("!%dH" % (len(data) // 2), data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def ext_bytes(name, f):
    if name == DETH:
        return struct.pack("!IB", f["qkey"], 0) + f["src_qp"].to_bytes(3, "big")
    if name == FETH:
        return struct.pack("!I", f["feth"])
    if name == RETH:
        return struct.pack("!QII", f["va"], f["rkey"], f["dma_len"])
    if name == ATOMIC_ETH:
        return struct.pack("!QIQQ", f["va"], f["rkey"], f["swap_add"], f["compare"])
    if name == AETH:
        return bytes([f["syndrome"]]) + f["msn"].to_bytes(3, "big")
    if name == ATOMIC_ACK:
        return struct.pack("!Q", f["orig"])
    if name == IMMDT:
        return struct.pack("!I", f["imm"])
    if name == IETH:
        return struct.pack("!I", f["inv_rkey"])
    raise ValueError(name)


def icrc(ip_hdr, udp_hdr, bth, rest):
    """The ICRC the way rxe defines it, from zlib's CRC-32."""
    ip = bytearray(ip_hdr)
    ip[1] = 0xFF            # TOS
    ip[8] = 0xFF            # TTL
    ip[10:12] = b"\xff\xff"  # header checksum
    udp = bytearray(udp_hdr)
    udp[6:8] = b"\xff\xff"   # UDP checksum
    b = bytearray(bth)
    b[4] = 0xFF             # FECN/BECN/reserved
    again = bytes(bth) + rest if bth[0] == 0x1C else b""  # rxe's FLUSH: the headers twice
    return zlib.crc32(b"\xff" * 8 + bytes(ip) + bytes(udp) + bytes(b) + rest + again) & 0xFFFFFFFF


def build_frame(f, payload):
    """A complete frame (with ICRC) from the field dict `f`; returns (frame, icrc)."""
    name, exts, _ = OPCODES[f["opcode"]]
    pad = (-len(payload)) & 3
    ext = b"".join(ext_bytes(e, f) for e in WIRE_ORDER if e in exts)
    bth = struct.pack(
        "!BBHB", f["opcode"],
        (0x80 if f["se"] else 0) | (0x40 if f["migreq"] else 0) | (pad << 4),
        f["pkey"], (0x80 if f["fecn"] else 0) | (0x40 if f["becn"] else 0))
    bth += f["dest_qp"].to_bytes(3, "big")
    bth += bytes([0x80 if f["ack_req"] else 0]) + f["psn"].to_bytes(3, "big")
    rest = ext + payload + b"\0" * pad
    udp_len = 8 + len(bth) + len(rest) + 4
    udp = struct.pack("!HHHH", f["sport"], 4791, udp_len, 0)
    total = 20 + udp_len
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, f["tos"], total, f["ip_id"], 0x4000, f["ttl"], 17, 0,
                     f["src_ip"].to_bytes(4, "big"), f["dst_ip"].to_bytes(4, "big"))
    ip = ip[:10] + struct.pack("!H", ones_complement_checksum(ip)) + ip[12:]
    crc = icrc(ip, udp, bth, rest)
    eth = f["dst_mac"] + f["src_mac"] + b"\x08\x00"
    return eth + ip + udp + bth + rest + struct.pack("<I", crc), crc


def random_fields(rng, opcode):
    syndromes = [0x1F, 0x00, 0x20 | 12, 0x20 | 0, 0x60, 0x61, 0x62, 0x63]
    return {
        "opcode": opcode,
        "dst_mac": bytes(rng.randrange(256) for _ in range(6)),
        "src_mac": bytes([0x52, 0x54, 0x00] + [rng.randrange(256) for _ in range(3)]),
        "src_ip": 0x0A000000 | rng.randrange(1, 1 << 24),
        "dst_ip": 0xC0A80000 | rng.randrange(1, 1 << 16),
        "tos": rng.choice([0, 0x02, 0x68, 0xFF]),
        "ttl": rng.choice([1, 64, 255]),
        "ip_id": rng.randrange(1 << 16),
        "sport": 0xC000 | rng.randrange(1 << 14),
        "se": rng.random() < 0.3,
        "migreq": rng.random() < 0.2,
        "pkey": rng.choice([0xFFFF, 0xFFFF, 0x8001]),
        "fecn": rng.random() < 0.2,
        "becn": rng.random() < 0.2,
        "dest_qp": rng.randrange(1 << 24),
        "ack_req": rng.random() < 0.5,
        "psn": rng.randrange(1 << 24),
        "va": rng.randrange(1 << 64),
        "rkey": rng.randrange(1 << 32),
        "dma_len": rng.randrange(1 << 32),
        "swap_add": rng.randrange(1 << 64),
        "compare": rng.randrange(1 << 64),
        "syndrome": rng.choice(syndromes),
        "msn": rng.randrange(1 << 24),
        "orig": rng.randrange(1 << 64),
        "imm": rng.randrange(1 << 32),
        "qkey": rng.choice([0x11111111, 0x80010000, rng.randrange(1 << 32)]),
        "src_qp": rng.randrange(1 << 24),
        "inv_rkey": rng.randrange(1 << 32),
        "feth": rng.randrange(4) << 4 | rng.randrange(1, 3),
    }


# (opcode, payload length) for the committed vectors.
CASES = [
    (0x04, 0), (0x04, 1), (0x04, 2), (0x04, 3), (0x04, 4), (0x04, 5), (0x04, 64), (0x04, 1024),
    (0x00, 1024), (0x01, 1024), (0x02, 7), (0x03, 13), (0x05, 0),
    (0x06, 1024), (0x07, 256), (0x08, 1), (0x09, 2), (0x0A, 4096), (0x0B, 33),
    (0x0C, 0), (0x0D, 1024), (0x0E, 1024), (0x0F, 3), (0x10, 0), (0x10, 100),
    (0x11, 0), (0x11, 0), (0x11, 0), (0x12, 0), (0x13, 0), (0x14, 0),
    (0x16, 9), (0x17, 10), (0x1C, 0), (0x1D, 8),
    (0x20, 256), (0x22, 6), (0x24, 31), (0x25, 12), (0x27, 512), (0x2B, 65),
    (0x64, 0), (0x64, 256), (0x65, 17),
]


def c_bytes(data, indent="    "):
    lines = []
    for i in range(0, len(data), 16):
        lines.append(indent + ", ".join("0x%02x" % b for b in data[i:i + 16]) + ",")
    return "\n".join(lines)


def main():
    rng = random.Random(4791)
    out = sys.stdout
    out.write("// Generated by tests/unit/roce/make_vectors.py (Python zlib.crc32); do not edit.\n")
    out.write("// Regenerate: python3 tests/unit/roce/make_vectors.py > tests/unit/roce/icrc_vectors.inc\n")
    out.write("// Included by icrc_test.cc and builder_test.cc inside namespace ufab::roce::testdata.\n\n")
    entries = []
    for n, (opcode, plen) in enumerate(CASES):
        f = random_fields(rng, opcode)
        payload = bytes(rng.randrange(256) for _ in range(plen))
        frame, crc = build_frame(f, payload)
        out.write("inline constexpr uint8_t kFrame%d[] = {\n%s\n};\n" % (n, c_bytes(frame)))
        name = "%s_%d" % (OPCODES[opcode][0].lower(), plen)
        entries.append(
            '    {"%s", kFrame%d, sizeof kFrame%d, 0x%08xu, 0x%02x, %d,\n'
            "     {%s}, {%s}, 0x%08xu, 0x%08xu, 0x%02x, %d, 0x%04x, 0x%04x,\n"
            "     %s, %s, 0x%04x, %s, %s, 0x%06xu, %s, 0x%06xu,\n"
            "     0x%016xull, 0x%08xu, 0x%08xu, 0x%016xull, 0x%016xull, 0x%02x, 0x%06xu,\n"
            "     0x%016xull, 0x%08xu, 0x%08xu, 0x%06xu, 0x%08xu, 0x%08xu},\n" % (
                name, n, n, crc, opcode, plen,
                ", ".join("0x%02x" % b for b in f["dst_mac"]), ", ".join("0x%02x" % b for b in f["src_mac"]),
                f["src_ip"], f["dst_ip"], f["tos"], f["ttl"], f["ip_id"], f["sport"],
                str(f["se"]).lower(), str(f["migreq"]).lower(), f["pkey"], str(f["fecn"]).lower(),
                str(f["becn"]).lower(), f["dest_qp"], str(f["ack_req"]).lower(), f["psn"],
                f["va"], f["rkey"], f["dma_len"], f["swap_add"], f["compare"], f["syndrome"], f["msn"],
                f["orig"], f["imm"], f["qkey"], f["src_qp"], f["inv_rkey"], f["feth"]))
    out.write("\ninline constexpr IcrcVector kIcrcVectors[] = {\n")
    out.write("".join(entries))
    out.write("};\n")


if __name__ == "__main__":
    main()
