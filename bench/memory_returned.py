"""Whether the server gives memory back after a big query: its RSS before, at the peak and
1, 2, 5 and 10 s after `SELECT cardinality(array_agg(g)) FROM generate_series(1, ROWS) AS t(g)`
(issue 38), for one or several builds side by side.

    python3 bench/memory_returned.py [--rows N] BIN[@NAME=VALUE,...] ...

Each argument is a `sluice` binary, optionally with environment variables for it after `@`
(an allocator's settings, say: `target/release/sluice@MIMALLOC_PURGE_DELAY=0`). Each is
started with a fresh data dir on a loopback port, warmed with `SELECT 1`, then given the
aggregate through psql; RSS is read from /proc/PID/status (VmRSS) every 50 ms.
"""
import os
import socket
import subprocess
import sys
import tempfile
import time

args = sys.argv[1:]
rows = 300_000_000
if len(args) >= 2 and args[0] == "--rows":
    rows = int(args[1])
    args = args[2:]
if not args:
    sys.exit(__doc__)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def psql(port, sql, background=False):
    cmd = ["psql", "-X", "-q", "-A", "-t", "-h", "127.0.0.1", "-p", str(port), "-U", "bench",
           "-d", "bench", "-c", sql]
    if background:
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip()


print(f"rows: {rows:,}")
print(f"{'build':<60} {'start MB':>9} {'peak MB':>9} {'+1 s':>8} {'+2 s':>8} {'+5 s':>8} {'+10 s':>8} {'query s':>8}")
for arg in args:
    binary, _, env_text = arg.partition("@")
    env = dict(os.environ)
    for pair in filter(None, env_text.split(",")):
        name, _, value = pair.partition("=")
        env[name] = value
    with tempfile.TemporaryDirectory() as data:
        port = free_port()
        log = open(os.path.join(data, "log"), "w+")
        server = subprocess.Popen(
            [binary, "serve", "--listen", f"127.0.0.1:{port}", "--data-dir", os.path.join(data, "d")],
            stdout=subprocess.DEVNULL, stderr=log, env=env, start_new_session=True)
        try:
            for _ in range(300):
                log.seek(0)
                if "listening on" in log.read():
                    break
                time.sleep(0.1)
            psql(port, "SELECT 1")
            time.sleep(1)
            start = rss_mb(server.pid)
            began = time.time()
            query = psql(port, f"SELECT cardinality(array_agg(g)) FROM generate_series(1, {rows}) AS t(g)", background=True)
            peak = start
            while query.poll() is None:
                peak = max(peak, rss_mb(server.pid))
                time.sleep(0.05)
            ended = time.time()
            out, err = query.communicate()
            if query.returncode != 0:
                print(f"{arg}: the query failed: {err.decode().strip()}")
            after = {}
            for at in (1, 2, 5, 10):
                time.sleep(max(0.0, ended + at - time.time()))
                after[at] = rss_mb(server.pid)
            print(f"{arg[-60:]:<60} {start:>9.0f} {peak:>9.0f} {after[1]:>8.0f} {after[2]:>8.0f} {after[5]:>8.0f} {after[10]:>8.0f} {ended - began:>8.1f}")
        finally:
            server.terminate()
            server.wait()
