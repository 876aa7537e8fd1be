#!/usr/bin/env bash
# SELECT 1 latency on one connection while three CPU-heavy queries run on others: the engine
# runs statements on its own threads, so sockets, admission and small statements are not
# queued behind the heavy ones' CPU work.
#
#   bench/neighbours.sh SLUICE_BIN [SECONDS]     (default 10)
#
# Prints pgbench's latency percentiles for SELECT 1 (one client, simple protocol) with no
# neighbours, then beside three `count(*)` scans over generate_series.
set -euo pipefail
bin="$1"
seconds="${2:-10}"
. "$(dirname "$0")/lib.sh"
start_sluice "$bin" 6551
echo 'SELECT 1;' > "$work/select1.sql"
measure() {
  rm -f "$work"/lat.*
  (cd "$work" && pgbench -n -M simple -c 1 -j 1 -T "$seconds" -f select1.sql \
    -h 127.0.0.1 -p "$port" -U bench -l --log-prefix=lat bench >/dev/null 2>&1)
  cat "$work"/lat.* | awk '{print $3}' | sort -n > "$work/sorted"
  local n
  n=$(wc -l < "$work/sorted")
  awk -v n="$n" -v label="$1" '
    NR == int(n * 0.50) + 1 {p50 = $1}
    NR == int(n * 0.99) + 1 {p99 = $1}
    NR == n {max = $1}
    END {printf "%s: %d queries, p50 %.3f ms, p99 %.3f ms, max %.3f ms\n", label, n, p50 / 1000, p99 / 1000, max / 1000}
  ' "$work/sorted"
}
measure "SELECT 1 alone"
for _ in 1 2 3; do
  command psql -X -q -h 127.0.0.1 -p "$port" -U bench bench \
    -c "SELECT count(*) FROM generate_series(1, 100000000000) WHERE generate_series % 7 = 3" \
    >/dev/null 2>&1 &
done
sleep 1
measure "SELECT 1 beside three CPU-heavy queries"
