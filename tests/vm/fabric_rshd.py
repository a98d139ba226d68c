#!/usr/bin/env python3
"""A remote shell for Open MPI's rsh launcher between the two VMs of
tests/vm/suites/fabric.sh (the guests have no sshd). Listens on ADDR:PORT;
each connection sends one line, the base64 of a shell command as ssh would
pass it (so a command may span lines), which
runs under `bash -c` with its stdout and stderr going back over the
connection; the connection closes when the command ends, and the command is
killed when the other side closes first. tests/vm/fabric_rsh.sh is the
client (Open MPI's plm_rsh_agent). Only for the test bed's private hub: it
runs whatever it is sent.

  fabric_rshd.py ADDR PORT SECONDS   (serves for at most SECONDS)
"""
import base64
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time


def serve(conn):
    with conn:
        line = b""
        while not line.endswith(b"\n"):
            chunk = conn.recv(4096)
            if not chunk:
                return
            line += chunk
        cmd = base64.b64decode(line.strip()).decode()
        proc = subprocess.Popen(["bash", "-c", cmd], stdin=subprocess.DEVNULL, stdout=conn.fileno(),
                                stderr=conn.fileno(), start_new_session=True)
        # The other side closing (the launcher gave up) ends the command.
        sel = selectors.DefaultSelector()
        sel.register(conn, selectors.EVENT_READ)
        while proc.poll() is None:
            if sel.select(timeout=0.5):
                try:
                    if not conn.recv(1, socket.MSG_PEEK):
                        os.killpg(proc.pid, signal.SIGTERM)
                        break
                except OSError:
                    break
        proc.wait()


def main():
    addr, port, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((addr, port))
    srv.listen(8)
    srv.settimeout(1.0)
    print(f"fabric_rshd: listening on {addr}:{port}", flush=True)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            conn, _ = srv.accept()
        except socket.timeout:
            continue
        threading.Thread(target=serve, args=(conn,), daemon=True).start()


if __name__ == "__main__":
    main()
