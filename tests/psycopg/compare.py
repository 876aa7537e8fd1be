"""Compares two pytest JUnit reports of psycopg's suite (directly, then through sluice): prints
the tests that pass directly and not through sluice, and exits 1 if any of them is not listed
in the optional third argument (a file of test ids, one a line, `#` comments: the losses that
are transaction pooling's nature)."""
import sys
import xml.etree.ElementTree as ET


def load(path):
    out = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        status, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error"):
                status, message = "failed", (child.get("message") or "")
                break
            if child.tag == "skipped":
                status = "skipped"
        out[name] = (status, message)
    return out


direct, through = load(sys.argv[1]), load(sys.argv[2])
allowed = set()
if len(sys.argv) > 3:
    with open(sys.argv[3]) as f:
        allowed = {l.split("#")[0].strip() for l in f} - {""}
lost = sorted(n for n, (s, _) in direct.items() if s == "passed" and through.get(n, ("missing",))[0] != "passed")
unexpected = [n for n in lost if n not in allowed]
passed = lambda report: sum(1 for s, _ in report.values() if s == "passed")
print(f"passed directly {passed(direct)}, through sluice {passed(through)}; lost {len(lost)}, of which {len(lost) - len(unexpected)} listed as the mode's nature")
for name in unexpected:
    print(f"  {name} | {through.get(name, ('missing', ''))[1].splitlines()[0][:200] if through.get(name, ('', ''))[1] else ''}")
sys.exit(1 if unexpected else 0)
