#!/usr/bin/env python3
"""The reports scenario, real and simulated, side by side.

Four query slots; random arrivals of slow reports (about 8 s) and fast ones (about 0.3 s),
each a `SELECT pg_sleep(s) AS report_<k>` from psycopg over the wire, time-compressed so that
a run takes a few minutes. Run once with one FIFO workload and once with sluice's lanes (fast
at higher priority with `demote_after`, slow capped at 3, learned lanes on), plus the fast
reports alone (unloaded). For each: fast-report p50/p99 completion, slow-report throughput,
and what `sluice simulate` predicts for the same trace and DDL.

    bench/reports.py SLUICE_BIN [--seconds 180] [--seed 1]

Needs psycopg 3 (the driver test's venv has it: /var/tmp/sluice-drivers-venv/bin/python).
Loopback only; each run starts its own `sluice serve` on a fresh data dir.
"""

import argparse
import asyncio
import csv
import os
import random
import subprocess
import sys
import tempfile
import time

import psycopg

SLOTS = 4
FAST_S, SLOW_S = 0.3, 8.0
# Arrival rates per second: fast reports, slow reports (4 slots: load ≈ 0.3 + 2.4 of 4).
FAST_RATE, SLOW_RATE = 1.0, 0.3
# Before the measured trace, each slow kind runs once (all at once) so that the lanes have
# learned them, as a server that has run these reports before has; the same warm-up runs
# under FIFO. The simulator sees it too, WARMUP_S before the measured trace.
WARMUP_S = 40.0
SLOW_KINDS, FAST_KINDS = 12, 40

FIFO = """CREATE RESOURCE report_slots (QUERY);
CREATE WORKLOAD all SETTINGS max_concurrent_queries = 4;
CREATE WORKLOAD reports IN all;
"""

LANES = """CREATE RESOURCE report_slots (QUERY);
CREATE WORKLOAD all SETTINGS max_concurrent_queries = 4;
CREATE WORKLOAD slow_reports IN all SETTINGS priority = 1, max_concurrent_queries = 3;
CREATE WORKLOAD reports IN all SETTINGS priority = 0, demote_after = '1s', demote_to = 'slow_reports';
"""


def make_trace(seconds, seed):
    """(arrival_s, kind, service_s, fast) sorted by arrival: two Poisson streams."""
    rng = random.Random(seed)
    out = []
    for rate, service, kinds, fast in ((FAST_RATE, FAST_S, FAST_KINDS, True),
                                       (SLOW_RATE, SLOW_S, SLOW_KINDS, False)):
        t = 0.0
        while True:
            t += rng.expovariate(rate)
            if t >= seconds:
                break
            kind = rng.randrange(kinds)
            jitter = rng.uniform(0.9, 1.1)
            out.append((t, ("f" if fast else "s") + str(kind), round(service * jitter, 3), fast))
    out.sort()
    return out


def warmup():
    return [(i * 0.1, "s" + str(i), SLOW_S, None) for i in range(SLOW_KINDS)]


def statement(kind, service):
    return f"SELECT pg_sleep({service}) AS report_{kind}"


def free_port():
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Server:
    def __init__(self, binary, ddl):
        self.dir = tempfile.mkdtemp(prefix="sluice-reports-")
        self.port = free_port()
        self.log = open(os.path.join(self.dir, "serve.log"), "w")
        self.proc = subprocess.Popen(
            [binary, "serve", "--listen", f"127.0.0.1:{self.port}", "--data-dir",
             os.path.join(self.dir, "data")],
            stdout=subprocess.DEVNULL, stderr=self.log)
        self.dsn = f"host=127.0.0.1 port={self.port} user=bench dbname=bench"
        for _ in range(100):
            try:
                with psycopg.connect(self.dsn, autocommit=True) as c:
                    for stmt in ddl.strip().split(";"):
                        if stmt.strip():
                            c.execute(stmt)
                return
            except psycopg.OperationalError:
                time.sleep(0.1)
        raise SystemExit("sluice did not start: see " + self.log.name)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)


async def replay(dsn, trace):
    """Runs each report at its arrival time on a connection of its own; completion times."""
    start = time.monotonic() + 1.0
    results = [None] * len(trace)
    conns = [await psycopg.AsyncConnection.connect(dsn, autocommit=True)
             for _ in range(150)]
    pool = asyncio.Queue()
    for c in conns:
        pool.put_nowait(c)

    async def one(i, at, kind, service):
        await asyncio.sleep(max(0.0, start + at - time.monotonic()))
        arrived = time.monotonic()
        conn = await pool.get()
        try:
            await conn.execute(statement(kind, service) + " SETTINGS workload = 'reports'")
        finally:
            pool.put_nowait(conn)
        results[i] = time.monotonic() - arrived

    await asyncio.gather(*(one(i, at, kind, s) for i, (at, kind, s, _) in enumerate(trace)))
    for c in conns:
        await c.close()
    return results


def quantile(values, q):
    v = sorted(values)
    return v[min(len(v) - 1, int(round((len(v) - 1) * q)))]


def figures(trace, done):
    fast = [d for (_, _, _, f), d in zip(trace, done) if f]
    slow = [(at + d) for (at, _, _, f), d in zip(trace, done) if not f]
    slow_n = len(slow)
    span = max(slow) - min(at for at, _, _, f in trace if not f)
    return {
        "fast_p50": quantile(fast, 0.5),
        "fast_p99": quantile(fast, 0.99),
        "slow_per_min": slow_n * 60.0 / span,
    }


def write_trace_csv(path, trace):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["arrival_s", "user", "application", "workload", "statement", "service_s"])
        for at, kind, service, _ in trace:
            w.writerow([f"{at:.3f}", "bench", "reports", "reports", statement(kind, service),
                        f"{service:.3f}"])


def simulated(binary, ddl, trace, trace_csv):
    """The simulator's fates for the trace, from its --each listing."""
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as f:
        f.write(ddl)
    out = subprocess.run([binary, "simulate", "--each", "--fast-under", "1", f.name, trace_csv],
                         check=True, capture_output=True, text=True).stdout
    done = []
    for line in out.splitlines():
        parts = line.split()
        if len(parts) > 6 and parts[0].isdigit():
            done.append(parse_duration(parts[5]))
    assert len(done) == len(trace), (len(done), len(trace))
    return done


def parse_duration(text):
    if text == "0":
        return 0.0
    if text.endswith("ms"):
        return float(text[:-2]) / 1000
    if text.endswith("s"):
        return float(text[:-1])
    if text.endswith("m"):
        return float(text[:-1]) * 60
    raise ValueError(text)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("sluice")
    p.add_argument("--seconds", type=float, default=180)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    trace = make_trace(args.seconds, args.seed)
    work = tempfile.mkdtemp(prefix="sluice-reports-trace-")
    trace_csv = os.path.join(work, "trace.csv")
    warm = warmup()
    write_trace_csv(trace_csv, warm + [(at + WARMUP_S, k, s, f) for at, k, s, f in trace])
    n_fast = sum(1 for t in trace if t[3])
    print(f"reports scenario: {len(trace)} reports ({n_fast} fast ≈ {FAST_S} s, "
          f"{len(trace) - n_fast} slow ≈ {SLOW_S} s) over {args.seconds:.0f} s, {SLOTS} slots, "
          f"seed {args.seed}, after a warm-up of {len(warm)} slow reports; {os.cpu_count()} CPUs; "
          f"{time.strftime('%Y-%m-%d')}", flush=True)

    # Unloaded: fast reports one at a time.
    server = Server(args.sluice, FIFO)
    alone_trace = [(i * 0.5, f"f{i % FAST_KINDS}", FAST_S, True) for i in range(40)]
    alone = asyncio.run(replay(server.dsn, alone_trace))
    server.stop()
    unloaded = {"fast_p50": quantile(alone, 0.5), "fast_p99": quantile(alone, 0.99)}

    rows = []
    for name, ddl in (("FIFO", FIFO), ("sluice lanes", LANES)):
        server = Server(args.sluice, ddl)
        asyncio.run(replay(server.dsn, warm))
        done = asyncio.run(replay(server.dsn, trace))
        server.stop()
        measured = figures(trace, done)
        predicted = figures(trace, simulated(args.sluice, ddl, warm + trace, trace_csv)[len(warm):])
        rows.append((name, measured, predicted))
        print(f"  {name}: done", flush=True)

    print()
    print("| run | fast p50 s | fast p99 s | slow per min | simulated fast p50 s | simulated fast p99 s | simulated slow per min |")
    print("|---|---|---|---|---|---|---|")
    print(f"| fast alone (unloaded) | {unloaded['fast_p50']:.3f} | {unloaded['fast_p99']:.3f} | – | – | – | – |")
    for name, m, s in rows:
        print(f"| {name} | {m['fast_p50']:.3f} | {m['fast_p99']:.3f} | {m['slow_per_min']:.2f} "
              f"| {s['fast_p50']:.3f} | {s['fast_p99']:.3f} | {s['slow_per_min']:.2f} |")
    fifo, lanes = rows[0][1], rows[1][1]
    print()
    print(f"fast p99 with lanes / unloaded: {lanes['fast_p99'] / unloaded['fast_p99']:.2f}×  (target ≤ 2×)")
    print(f"slow throughput lanes / FIFO: {lanes['slow_per_min'] / fifo['slow_per_min']:.2f}  (target within 10%)")
    for name, m, s in rows:
        print(f"{name}: simulated/measured fast p50 {s['fast_p50'] / m['fast_p50']:.2f}, "
              f"fast p99 {s['fast_p99'] / m['fast_p99']:.2f}  (target within 20%)")


if __name__ == "__main__":
    sys.exit(main())
