#!/usr/bin/python3
"""A stand-in for the server side of ibv_rc_pingpong's TCP exchange.

It answers one client with a made-up peer (lid 0, a fixed QPN and PSN, the
GID of an IPv4 address nobody owns), so the client's RC QP goes to RTS and
sends its SENDs onto the wire, where a pcap records them; nobody answers.

Exchange (libibverbs/examples/rc_pingpong.c, pp_server_exch_dest): read the
client's 52-byte "%04x:%06x:%06x:%s" message (lid:qpn:psn:gid as 32 hex
digits), write ours, read the client's "done\\0".  Prints the client's
message as one line "client lid=... qpn=... psn=... gid=..." on stdout.

Usage: fake_pingpong_server.py PORT QPN_HEX PSN_HEX GID_HEX HOLD_SECONDS
Everything is bounded: accept and every read time out after 30 s.
"""
import socket
import sys

MSG_LEN = 52


def read_exact(conn, n):
    data = b""
    for _ in range(n):  # at most n reads, each returns at least one byte
        if len(data) >= n:
            break
        chunk = conn.recv(n - len(data))
        if not chunk:
            break
        data += chunk
    return data


def main():
    if len(sys.argv) != 6:
        print(__doc__, file=sys.stderr)
        return 2
    port = int(sys.argv[1])
    qpn = int(sys.argv[2], 16)
    psn = int(sys.argv[3], 16)
    gid = sys.argv[4].lower()
    hold = float(sys.argv[5])
    if len(gid) != 32 or any(c not in "0123456789abcdef" for c in gid):
        print("fake_pingpong_server: GID must be 32 hex digits", file=sys.stderr)
        return 2
    reply = ("%04x:%06x:%06x:%s" % (0, qpn, psn, gid)).encode() + b"\0"
    # rc_pingpong sends sizeof "0000:000000:000000:" + 32 = 51 chars + NUL
    if len(reply) != MSG_LEN:
        print("fake_pingpong_server: internal error, reply is %d bytes" % len(reply), file=sys.stderr)
        return 2

    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", port))
    srv.listen(1)
    srv.settimeout(30)
    print("fake_pingpong_server: listening on 127.0.0.1:%d" % port, file=sys.stderr, flush=True)
    conn, _ = srv.accept()
    conn.settimeout(30)
    msg = read_exact(conn, MSG_LEN)
    if len(msg) != MSG_LEN:
        print("fake_pingpong_server: client sent %d bytes, not %d" % (len(msg), MSG_LEN), file=sys.stderr)
        return 1
    text = msg.rstrip(b"\0").decode("ascii", "replace")
    parts = text.split(":")
    if len(parts) != 4 or len(parts[3]) != 32:
        print("fake_pingpong_server: cannot read the client's message %r" % text, file=sys.stderr)
        return 1
    print("client lid=%s qpn=%s psn=%s gid=%s" % tuple(parts), flush=True)
    conn.sendall(reply)
    done = read_exact(conn, 5)
    print("fake_pingpong_server: got %r after our reply" % done, file=sys.stderr, flush=True)
    conn.settimeout(hold)
    try:
        conn.recv(1)  # keep the connection open while the client sends
    except socket.timeout:
        pass
    conn.close()
    srv.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
