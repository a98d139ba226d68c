#!/usr/bin/env python3
"""Writes the seed corpus for cm_mad_fuzzer into corpus/cm_mad/.

One valid 256-byte CM MAD per attribute (REQ .. APR) with random field
bytes (the length and code fields kept in range), a REQ shaped like the
kernel rdma_cm's (cma_hdr in its private data, IPv4 and IPv6), and one file
per parser rejection: wrong size, base version, class, class version,
method, attribute, REJ ARI length, MRA/REJ message code 3, SIDR_REP and APR
information lengths. Offsets from include/rdma/ibta_vol1_c12.h (see
docs/cm.md). Deterministic: rerunning rewrites the same bytes.

    python3 tests/fuzz/make_cm_corpus.py
"""

import os
import random
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "corpus", "cm_mad")

ATTRS = {"req": 0x10, "mra": 0x11, "rej": 0x12, "rep": 0x13, "rtu": 0x14, "dreq": 0x15, "drep": 0x16,
         "sidr_req": 0x17, "sidr_rep": 0x18, "lap": 0x19, "apr": 0x1A}


def header(attr, tid, base=1, mclass=0x07, cver=2, method=0x03):
    return struct.pack("!BBBBHHQHHI", base, mclass, cver, method, 0, 0, tid, attr, 0, 0)


def body(rng, name):
    d = bytearray(rng.randrange(256) for _ in range(232))
    if name in ("mra", "rej"):
        d[8] = (rng.randrange(3) << 6) | (d[8] & 0x3F)
    if name == "rej":
        d[9] = (rng.randrange(73) << 1) | (d[9] & 1)
    if name == "sidr_rep":
        d[5] = rng.randrange(73)
    if name == "apr":
        d[8] = rng.randrange(73)
    return d


def cma_req(rng, ip6):
    d = bytearray(232)
    struct.pack_into("!I", d, 0, rng.getrandbits(32))
    struct.pack_into("!Q", d, 8, 0x0000000001060000 | 7174)
    struct.pack_into("!Q", d, 16, 0x505400FFFE123402)
    d[32:35] = (0x11).to_bytes(3, "big")
    d[35] = 1
    d[39] = 1
    d[43] = 20 << 3
    d[44:47] = rng.getrandbits(24).to_bytes(3, "big")
    d[47] = (20 << 3) | 7
    struct.pack_into("!H", d, 48, 0xFFFF)
    d[50] = (3 << 4) | 7
    d[51] = 15 << 4
    struct.pack_into("!HH", d, 52, 0xFFFF, 0xFFFF)
    d[56:72] = bytes(10) + b"\xff\xff" + bytes([10, 0, 0, 2])
    d[72:88] = bytes(10) + b"\xff\xff" + bytes([10, 0, 0, 1])
    struct.pack_into("!I", d, 88, (0x2B1C5 << 12) | 3)
    d[93] = 64
    d[95] = 17 << 3
    if ip6:
        hdr = bytes([0, 0x60]) + struct.pack("!H", 40001) + bytes(10) + b"\xff\xff" + bytes([10, 0, 0, 2]) + \
            bytes.fromhex("fe800000000000005054fffffe123401")
    else:
        hdr = bytes([0, 0x40]) + struct.pack("!H", 40001) + bytes(12) + bytes([10, 0, 0, 2]) + bytes(12) + \
            bytes([10, 0, 0, 1])
    d[140:176] = hdr
    d[176:180] = b"ufab"
    return d


def main():
    rng = random.Random(1414)
    os.makedirs(OUT, exist_ok=True)
    for name in os.listdir(OUT):
        os.unlink(os.path.join(OUT, name))
    seeds = {}
    for name, attr in ATTRS.items():
        seeds["valid_" + name] = header(attr, rng.getrandbits(64)) + body(rng, name)
    seeds["valid_req_rdma_cm_ipv4"] = header(0x10, 0x000000011A2B3C4D) + cma_req(rng, False)
    seeds["valid_req_rdma_cm_ipv6"] = header(0x10, 0x000000011A2B3C4E) + cma_req(rng, True)
    req = seeds["valid_req_rdma_cm_ipv4"]
    seeds["bad_short"] = req[:255]
    seeds["bad_long"] = req + b"\0"
    seeds["bad_header_only"] = req[:24]
    seeds["bad_base_version"] = header(0x10, 1, base=2) + req[24:]
    seeds["bad_class"] = header(0x10, 1, mclass=0x04) + req[24:]
    seeds["bad_class_version"] = header(0x10, 1, cver=1) + req[24:]
    seeds["bad_method_get_resp"] = header(0x10, 1, method=0x81) + req[24:]
    seeds["bad_attribute_class_port_info"] = header(0x01, 1) + req[24:]
    seeds["bad_attribute_1b"] = header(0x1B, 1) + req[24:]
    seeds["bad_cma_version"] = req[:164] + b"\x01" + req[165:]
    seeds["bad_cma_ip_version"] = req[:165] + b"\x50" + req[166:]
    rej = bytearray(seeds["valid_rej"])
    rej[24 + 9] = 73 << 1
    seeds["bad_rej_ari_length"] = bytes(rej)
    rej[24 + 9] = 0
    rej[24 + 8] = 0xC0
    seeds["bad_rej_message_code"] = bytes(rej)
    mra = bytearray(seeds["valid_mra"])
    mra[24 + 8] = 0xC0
    seeds["bad_mra_message_code"] = bytes(mra)
    sidr = bytearray(seeds["valid_sidr_rep"])
    sidr[24 + 5] = 200
    seeds["bad_sidr_rep_info_length"] = bytes(sidr)
    apr = bytearray(seeds["valid_apr"])
    apr[24 + 8] = 73
    seeds["bad_apr_info_length"] = bytes(apr)
    for name, data in sorted(seeds.items()):
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(data)
    print("wrote %d seeds to %s" % (len(seeds), os.path.relpath(OUT)))


if __name__ == "__main__":
    main()
