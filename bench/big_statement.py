#!/usr/bin/env python3
"""What a statement of megabytes costs the other clients of its connection thread.

One client sends a big `SELECT 1,1,1,…` (a simple Query, or Parse/Bind/Execute/Sync) to a
running sluice; as it is sent, a second client runs `psql -c 'select 1'` a few times, and each
run's time is printed, then when the big statement was answered. With the text read on the
connection thread, the first probe waits for that reading; read apart, it takes what psql
alone takes (run `psql -c 'select 1'` against the idle server to know that).

    bench/big_statement.py PORT [query|parse] [MEGABYTES] [PROBES]    (defaults query 8 3)

PGUSER and PGDATABASE name the role and database (default postgres). Loopback only; needs
psql.
"""
import os
import socket
import struct
import subprocess
import sys
import threading
import time


def message(tag, body):
    return tag + struct.pack("!i", len(body) + 4) + body


def main():
    port = int(sys.argv[1])
    mode = sys.argv[2] if len(sys.argv) > 2 else "query"
    megabytes = int(sys.argv[3]) if len(sys.argv) > 3 else 8
    probes = int(sys.argv[4]) if len(sys.argv) > 4 else 3
    user = os.environ.get("PGUSER", "postgres")
    database = os.environ.get("PGDATABASE", "postgres")
    sql = b"SELECT 1" + b",1" * (megabytes * (1 << 19))

    s = socket.create_connection(("127.0.0.1", port))
    params = b"user\0" + user.encode() + b"\0database\0" + database.encode() + b"\0\0"
    s.sendall(struct.pack("!ii", len(params) + 8, 196608) + params)
    answer = b""
    while b"Z\0\0\0\x05" not in answer:
        answer += s.recv(65536)
    if mode == "parse":
        payload = (
            message(b"P", b"\0" + sql + b"\0\0\0")
            + message(b"B", b"\0\0\0\0\0\0\0\0")
            + message(b"E", b"\0\0\0\0\0")
            + message(b"S", b"")
        )
    else:
        payload = message(b"Q", sql + b"\0")
    started = time.time()
    s.sendall(payload)
    print(f"{len(sql) / 1e6:.1f} MB {mode} sent in {time.time() - started:.2f} s", flush=True)

    def probe():
        for _ in range(probes):
            asked = time.time()
            subprocess.run(
                ["psql", "-X", "-h", "127.0.0.1", "-p", str(port), "-U", user, "-d", database,
                 "-Atc", "select 1"],
                capture_output=True,
            )
            print(f"  probe at {asked - started:.2f} s took {time.time() - asked:.2f} s", flush=True)
            time.sleep(0.3)

    prober = threading.Thread(target=probe)
    prober.start()
    answer = b""
    while b"Z\0\0\0\x05" not in answer:
        data = s.recv(65536)
        if not data:
            break
        answer += data
    print(f"the big statement answered at {time.time() - started:.2f} s", flush=True)
    prober.join()


if __name__ == "__main__":
    main()
