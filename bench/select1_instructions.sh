#!/usr/bin/env bash
# The embedded engine's user-space instructions per `SELECT 1` (valgrind's callgrind): pgbench
# against `sluice serve` with the QUERY tree of bench/pgbench.sh, 4 clients; 4 × 1,000
# transactions of warm-up, then 4 × 2,000 counted. Instruction counts do not move with the
# machine's load, so this tells whether a change to the statement path made it cheaper.
#
#   bench/select1_instructions.sh BIN [simple|extended|prepared]
#
# Prints the count per transaction and callgrind_annotate's inclusive top 40 (the profile is
# kept in $TMPDIR). Needs valgrind, pgbench and psql; loopback only.
set -euo pipefail
bin=$1
mode=${2:-simple}
work=$(mktemp -d)
trap 'kill "$pid" 2>/dev/null || true' EXIT
out="$work/callgrind.out"
valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$out" \
  "$bin" serve --listen 127.0.0.1:6601 --data-dir "$work/data" >"$work/log" 2>&1 &
pid=$!
for _ in $(seq 300); do grep -q "listening on" "$work/log" 2>/dev/null && break; sleep 0.2; done
psql -X -q -h 127.0.0.1 -p 6601 -U bench -d bench \
  -c "CREATE RESOURCE slots (QUERY)" \
  -c "CREATE WORKLOAD all SETTINGS max_concurrent_queries = 1000"
echo 'SELECT 1;' >"$work/select1.sql"
run() {
  PGOPTIONS='-c workload=all' pgbench -n -M "$mode" -c 4 -j 4 -t "$1" -f "$work/select1.sql" \
    -h 127.0.0.1 -p 6601 -U bench postgres >/dev/null 2>&1
}
run 1000
callgrind_control -i on "$pid" >/dev/null 2>&1
run 2000
callgrind_control -i off "$pid" >/dev/null 2>&1
callgrind_control -d "$pid" >/dev/null 2>&1
sleep 1
kill "$pid"; wait "$pid" 2>/dev/null || true
profile=$(ls -S "$out"* | head -1)
awk '/^totals:/ {printf "%s: %d instructions per transaction\n", "'"$mode"'", $2 / 8000}' "$profile"
callgrind_annotate --inclusive=yes "$profile" 2>/dev/null | sed -n '25,65p' | cut -c1-200
echo "(profile: $profile)"
