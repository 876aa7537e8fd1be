"""Streams a large result from sluice and reports the server's peak memory.

    python3 bench/stream_rss.py SLUICE_BIN [ROWS]      (default 200,000,000 rows)

Starts `SLUICE_BIN serve` on a loopback port with a fresh data dir, sends
`SELECT * FROM generate_series(1, ROWS)` over the simple protocol from a client that reads and
discards every row (it keeps nothing, so only the server's memory is measured), then psql with
FETCH_COUNT (a cursor: DECLARE, FETCH FORWARD n, CLOSE), and prints rows, seconds, and the
server's peak RSS (VmHWM) after each.
"""
import os
import socket
import struct
import subprocess
import sys
import tempfile
import time

binary = sys.argv[1]
rows = int(sys.argv[2]) if len(sys.argv) > 2 else 200_000_000


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def hwm_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def raw_query(port, sql):
    """Runs `sql` with the simple protocol; returns the number of DataRows, discarding them."""
    s = socket.create_connection(("127.0.0.1", port))
    body = struct.pack("!i", 196608) + b"user\0bench\0database\0bench\0\0"
    s.sendall(struct.pack("!i", len(body) + 4) + body)
    buf = b""

    def messages():
        nonlocal buf
        while True:
            at = 0
            while len(buf) - at >= 5:
                (length,) = struct.unpack_from("!i", buf, at + 1)
                if len(buf) - at < 1 + length:
                    break
                yield buf[at:at + 1]
                at += 1 + length
            buf = buf[at:]
            chunk = s.recv(1 << 20)
            if not chunk:
                return
            buf += chunk

    gen = messages()
    for kind in gen:
        if kind == b"Z":
            break
    q = sql.encode() + b"\0"
    s.sendall(b"Q" + struct.pack("!i", len(q) + 4) + q)
    n = 0
    for kind in gen:
        if kind == b"D":
            n += 1
        elif kind == b"E":
            raise SystemExit("query failed")
        elif kind == b"Z":
            break
    s.close()
    return n


with tempfile.TemporaryDirectory() as work:
    port = free_port()
    log = open(os.path.join(work, "sluice.log"), "w")
    server = subprocess.Popen(
        [binary, "serve", "--listen", f"127.0.0.1:{port}", "--data-dir", os.path.join(work, "data")],
        stdout=subprocess.DEVNULL, stderr=log,
    )
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port)).close()
                break
            except OSError:
                time.sleep(0.1)
        print(f"server RSS at start: {hwm_mb(server.pid):.0f} MB")
        sql = f"SELECT * FROM generate_series(1, {rows})"
        start = time.time()
        n = raw_query(port, sql)
        print(f"raw client: {n} rows in {time.time() - start:.1f} s; server peak RSS {hwm_mb(server.pid):.0f} MB")
        start = time.time()
        out = subprocess.run(
            ["psql", "-X", "-q", "-h", "127.0.0.1", "-p", str(port), "-U", "bench", "bench",
             "-v", "FETCH_COUNT=10000", "-c", "\\o /dev/null", "-c", sql],
            capture_output=True, text=True,
        )
        if out.returncode != 0:
            raise SystemExit(f"psql failed: {out.stderr}")
        print(f"psql (FETCH_COUNT=10000, \\o /dev/null): {time.time() - start:.1f} s; server peak RSS {hwm_mb(server.pid):.0f} MB")
    finally:
        server.terminate()
        server.wait()
