#!/usr/bin/env python3
"""Regenerates the expected outputs of the differential tests from ClickHouse itself.

    python3 -m venv .venv-oracle && .venv-oracle/bin/pip install chdb-core==26.9.0
    .venv-oracle/bin/python tests/differential/generate.py [NAME.sql ...]

For every tests/differential/*.sql and grammar/examples/*.sql (or the ones named: paths, or bare
names in tests/differential) it runs the script in a fresh in-process
ClickHouse 26.9 (chDB) and writes NAME.expected in the format of `sluice check --dump`:
'>> statement', then 'OK' or 'ERROR <CODE>: <message>' for each statement, then the sections
'== system.workloads', '== system.resources', '== system.scheduler' (header row, then rows as
ClickHouse's TSVRaw prints them, sorted byte-wise). It also writes machine.txt: the cores and
memory ClickHouse saw, which the Rust test pins with --cores / --memory.

The test suite never runs this: it only reads the committed .expected files.
"""
import os
import re
import subprocess
import sys
import tempfile
import shutil

HERE = os.path.dirname(os.path.abspath(__file__))
ORACLE = os.environ.get("SLUICE_ORACLE_DIR", os.path.join(HERE, "..", "..", "..", "shared", "oracle"))
sys.path.insert(0, ORACLE)

DUMP = [
    ("system.workloads", "SELECT name, parent, create_query FROM system.workloads ORDER BY name"),
    ("system.resources", "SELECT name, read_disks, write_disks, unit, create_query FROM system.resources ORDER BY name"),
    ("system.scheduler", "SELECT resource, path, type, weight, priority, precedence, max_requests, max_cost, max_speed, max_burst FROM system.scheduler ORDER BY resource, path"),
]


def run_one(path):
    from ch_oracle import split_statements
    from chdb import session

    state = tempfile.mkdtemp(prefix="sluice-oracle-")
    out = []
    try:
        s = session.Session(state)
        for stmt in split_statements(open(path).read()):
            out.append(">> " + " ".join(stmt.split()))
            try:
                s.query(stmt, "TSV")
                out.append("OK")
            except Exception as e:
                msg = str(e).strip().splitlines()[0]
                m = re.search(r"\(([A-Z_]+)\)\s*$", msg)
                code = m.group(1) if m else "UNKNOWN"
                msg = re.sub(r"^Code: \d+\. DB::Exception: ", "", msg)
                out.append(f"ERROR {code}: {msg}")
        for table, query in DUMP:
            out.append(f"== {table}")
            res = str(s.query(query, "TSVRawWithNames")).rstrip("\n")
            out.extend(res.split("\n"))
        threads = str(s.query("SELECT value FROM system.settings WHERE name = 'max_threads'", "TSVRaw"))
    finally:
        shutil.rmtree(state, ignore_errors=True)
    return "\n".join(out) + "\n", threads.strip()


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--one":
        text, threads = run_one(sys.argv[2])
        sys.stdout.write(text)
        sys.stderr.write(threads + "\n")
        return
    root = os.path.join(HERE, "..", "..")
    examples = os.path.join(root, "grammar", "examples")
    if sys.argv[1:]:
        paths = [os.path.abspath(a) if os.path.exists(a) else os.path.join(HERE, a) for a in sys.argv[1:]]
    else:
        paths = [os.path.join(d, f) for d in (HERE, examples) for f in sorted(os.listdir(d)) if f.endswith(".sql")]
    cores = None
    for path in paths:
        name = os.path.relpath(path, root)
        # A fresh process per script: one chDB session per process.
        res = subprocess.run([sys.executable, __file__, "--one", path], capture_output=True, text=True, check=True)
        with open(path[:-4] + ".expected", "w") as f:
            f.write(res.stdout)
        m = re.search(r"(\d+)", res.stderr)
        cores = m.group(1) if m else cores
        print(f"{name}: {res.stdout.count(chr(10))} lines")
    mem = 0
    for line in open("/proc/meminfo"):
        if line.startswith("MemTotal:"):
            mem = int(line.split()[1]) * 1024
    with open(os.path.join(HERE, "machine.txt"), "w") as f:
        f.write(f"cores={cores}\nmemory={mem}\n")


if __name__ == "__main__":
    main()
