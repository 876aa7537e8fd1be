#!/usr/bin/env bash
# A TPC-H-like aggregation (Q1's shape: group by a low-cardinality key, sums and averages)
# over generated rows, run with the scheduler off (a workload no resource knows) and on (QUERY,
# CPU and MEMORY resources, one leaf), alternating, in one server.
#
#   bench/scheduler_overhead.sh SLUICE_BIN [ROWS] [RUNS]     (defaults 600000000, 3)
set -euo pipefail
bin="$1"
rows="${2:-600000000}"
runs="${3:-3}"
. "$(dirname "$0")/lib.sh"
start_sluice "$bin" 6553
psql -c "CREATE RESOURCE slots (QUERY)" \
     -c "CREATE RESOURCE cpu (MASTER THREAD, WORKER THREAD)" \
     -c "CREATE RESOURCE mem (MEMORY RESERVATION)" \
     -c "CREATE WORKLOAD all SETTINGS max_concurrent_queries = 10, max_concurrent_threads = 8, max_memory = '8Gi'" \
     -c "CREATE WORKLOAD reports IN all"
query="SELECT g % 4 AS returnflag, g % 3 AS linestatus, sum(g) AS sum_qty, sum(g * 0.9) AS sum_price, avg(g) AS avg_qty, count(*) AS n FROM generate_series(1, $rows) AS t(g) GROUP BY 1, 2 ORDER BY 1, 2"
timed() {
  local start end
  start=$(date +%s.%N)
  psql -At -c "$query SETTINGS workload = '$1'" >/dev/null
  end=$(date +%s.%N)
  echo "$(echo "$end - $start" | bc)"
}
off=(); on=()
for _ in $(seq "$runs"); do
  off+=("$(timed unscheduled)")
  on+=("$(timed reports)")
done
echo "scheduler off: ${off[*]} s"
echo "scheduler on:  ${on[*]} s"
