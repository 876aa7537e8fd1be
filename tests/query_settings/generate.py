#!/usr/bin/env python3
"""Writes settings.expected from ClickHouse 26.9 itself: for each statement of settings.sql,
`OK` or the code name of ClickHouse's error. Run by hand under the oracle venv, never by
the suite:

    .venv-oracle/bin/python tests/query_settings/generate.py ../shared/oracle/ch_oracle.py
"""
import pathlib
import subprocess
import sys

here = pathlib.Path(__file__).parent
oracle = sys.argv[1]
out = subprocess.run(
    [sys.executable, oracle, str(here / "settings.sql")],
    check=True,
    capture_output=True,
    text=True,
).stdout.splitlines()
lines = []
for i, line in enumerate(out):
    if not line.startswith(">> "):
        continue
    answer = out[i + 1] if i + 1 < len(out) else ""
    outcome = answer.split(":")[0].split(" ")[1] if answer.startswith("ERROR ") else "OK"
    lines.append(f"{line[3:]}\t{outcome}")
(here / "settings.expected").write_text("\n".join(lines) + "\n")
print(f"{len(lines)} statements")
