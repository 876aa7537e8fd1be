#!/usr/bin/env python3
"""What a session keeps of the statements it ran: the server's RSS while one client runs many
distinct statements of megabytes, each a long string literal (which plans, so a plan cache
would keep it), then idles, then leaves.

    bench/distinct_statements_rss.py PORT PID [STATEMENTS] [MEGABYTES]    (defaults 40 8)

PID is the server's process (its RSS is read from /proc). PGUSER and PGDATABASE name the role
and database (default postgres). Loopback only; the standard library only.
"""
import os
import socket
import struct
import sys
import time


def message(tag, body):
    return tag + struct.pack("!i", len(body) + 4) + body


def rss_mb(pid):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) // 1024
    return -1


def until_ready(s):
    """Reads to the next ReadyForQuery; returns whether an ErrorResponse came before it."""
    answer, failed = b"", False
    while True:
        while len(answer) < 5:
            data = s.recv(65536)
            if not data:
                raise SystemExit("the server closed the connection")
            answer += data
        tag, length = answer[:1], struct.unpack("!i", answer[1:5])[0]
        while len(answer) < 1 + length:
            answer += s.recv(65536)
        failed |= tag == b"E"
        answer = answer[1 + length:]
        if tag == b"Z":
            return failed


def main():
    port, pid = int(sys.argv[1]), int(sys.argv[2])
    statements = int(sys.argv[3]) if len(sys.argv) > 3 else 40
    megabytes = int(sys.argv[4]) if len(sys.argv) > 4 else 8
    user = os.environ.get("PGUSER", "postgres")
    database = os.environ.get("PGDATABASE", "postgres")
    s = socket.create_connection(("127.0.0.1", port))
    params = b"user\0" + user.encode() + b"\0database\0" + database.encode() + b"\0\0"
    s.sendall(struct.pack("!ii", len(params) + 8, 196608) + params)
    until_ready(s)
    print(f"RSS at the start: {rss_mb(pid)} MB", flush=True)
    started, failures = time.time(), 0
    for i in range(statements):
        literal = chr(ord("a") + i % 26).encode() * (megabytes << 20)
        sql = b"SELECT length('" + literal + b"') + " + str(i).encode()
        s.sendall(message(b"Q", sql + b"\0"))
        failures += until_ready(s)
    print(
        f"RSS after {statements} distinct statements of {megabytes} MB "
        f"({time.time() - started:.1f} s, {failures} refused): {rss_mb(pid)} MB",
        flush=True,
    )
    time.sleep(3)
    print(f"RSS 3 s later, the client idle: {rss_mb(pid)} MB", flush=True)
    s.sendall(message(b"X", b""))
    s.close()
    time.sleep(2)
    print(f"RSS 2 s after the client left: {rss_mb(pid)} MB", flush=True)


if __name__ == "__main__":
    main()
