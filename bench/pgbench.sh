#!/usr/bin/env bash
# SELECT 1 through pgbench, side by side: sluice (release build, embedded engine) and the
# machine's PostgreSQL, in one run on this machine. For each protocol (simple, extended) and
# client count (1, 16, 64): TPS, p50 and p99 latency, and sluice's ratio to PostgreSQL.
#
#   bench/pgbench.sh [SECONDS_PER_RUN]      (default 10)
#
# SLUICE_BIN=path uses that binary instead of building one. SLUICE_BASELINE_BIN=path also runs
# a second sluice (an older build, say) in the same run and reports the new one's TPS as a
# ratio of it: before and after on the same machine, minutes apart.
#
# Needs pgbench and PostgreSQL's server binaries (initdb, pg_ctl, postgres) on PATH or in
# /usr/local/bin or /usr/lib/postgresql/*/bin. Everything runs on loopback, in a temp dir.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/postgres.sh

seconds="${1:-10}"
need_tools pgbench initdb pg_ctl
bench_dir
pg_port=54329
sluice_port=6549
release_sluice
baseline_port=6550

start_postgres "$pg_port" 200

# start_sluice BIN PORT DIR -> pid; the admission path as it is in production: SELECT 1 goes
# through a QUERY resource.
start_sluice() {
  local bin=$1 port=$2 dir=$3
  # A session of its own, as PostgreSQL's (bench/postgres.sh, `server_session`).
  setsid "$bin" serve --listen "127.0.0.1:$port" --data-dir "$dir" >/dev/null 2>"$dir.log" &
  local pid=$!
  for _ in $(seq 100); do
    grep -q "listening on" "$dir.log" 2>/dev/null && break
    sleep 0.1
  done
  psql -X -q -h 127.0.0.1 -p "$port" -U bench -d bench \
    -c "CREATE RESOURCE slots (QUERY)" \
    -c "CREATE WORKLOAD all SETTINGS max_concurrent_queries = 1000" >/dev/null
  echo "$pid"
}
echo "== starting sluice ($SLUICE_BIN)" >&2
sluice_pid=$(start_sluice "$SLUICE_BIN" "$sluice_port" "$work/sluice")
pids+=("$sluice_pid")
if [ -n "${SLUICE_BASELINE_BIN:-}" ]; then
  echo "== starting the baseline sluice ($SLUICE_BASELINE_BIN)" >&2
  baseline_pid=$(start_sluice "$SLUICE_BASELINE_BIN" "$baseline_port" "$work/baseline")
  pids+=("$baseline_pid")
fi
echo 'SELECT 1;' > "$work/select1.sql"

# run PORT MODE CLIENTS -> "tps p50_ms p99_ms"
run() {
  local port=$1 mode=$2 clients=$3 threads
  # A thread per client: pgbench caches "now" per thread, so threads that serve several
  # clients log 0 µs latencies for some transactions and the percentiles go wrong.
  threads=$clients
  rm -f "$work"/log.*
  local out
  out=$(cd "$work" && PGOPTIONS="$( [ "$port" != "$pg_port" ] && echo '-c workload=all' )" \
    pgbench -n -M "$mode" -c "$clients" -j "$threads" -T "$seconds" -f select1.sql \
      -h 127.0.0.1 -p "$port" -U bench -l --log-prefix=log postgres 2>&1 || true)
  local tps
  tps=$(echo "$out" | awk '/^tps = / {print $3}')
  if [ -z "$tps" ]; then
    echo "bench: pgbench against port $port ($mode, $clients clients) failed:" >&2
    echo "$out" >&2
    exit 1
  fi
  local p50 p99
  read -r p50 p99 < <(percentiles)
  echo "$tps $p50 $p99"
}

echo
echo "pgbench SELECT 1, ${seconds} s per run, $(nproc) CPUs, $(date -u +%Y-%m-%d)"
echo
if [ -z "${SLUICE_BASELINE_BIN:-}" ]; then
  echo "| protocol | clients | PostgreSQL TPS | sluice TPS | TPS ratio | PG p50 ms | sluice p50 ms | PG p99 ms | sluice p99 ms |"
  echo "|---|---|---|---|---|---|---|---|---|"
else
  echo "| protocol | clients | PostgreSQL TPS | baseline TPS | sluice TPS | sluice/baseline | sluice/PG | baseline/PG | sluice p50 ms | sluice p99 ms |"
  echo "|---|---|---|---|---|---|---|---|---|---|"
fi
for mode in simple extended; do
  for clients in 1 16 64; do
    read -r pg_tps pg_p50 pg_p99 < <(run "$pg_port" "$mode" "$clients")
    read -r sl_tps sl_p50 sl_p99 < <(run "$sluice_port" "$mode" "$clients")
    ratio=$(awk -v a="$sl_tps" -v b="$pg_tps" 'BEGIN {printf "%.0f%%", 100 * a / b}')
    if [ -z "${SLUICE_BASELINE_BIN:-}" ]; then
      printf "| %s | %s | %.0f | %.0f | %s | %s | %s | %s | %s |\n" \
        "$mode" "$clients" "$pg_tps" "$sl_tps" "$ratio" "$pg_p50" "$sl_p50" "$pg_p99" "$sl_p99"
    else
      read -r bl_tps _ _ < <(run "$baseline_port" "$mode" "$clients")
      vs=$(awk -v a="$sl_tps" -v b="$bl_tps" 'BEGIN {printf "%.0f%%", 100 * a / b}')
      bl=$(awk -v a="$bl_tps" -v b="$pg_tps" 'BEGIN {printf "%.0f%%", 100 * a / b}')
      printf "| %s | %s | %.0f | %.0f | %.0f | %s | %s | %s | %s | %s |\n" \
        "$mode" "$clients" "$pg_tps" "$bl_tps" "$sl_tps" "$vs" "$ratio" "$bl" "$sl_p50" "$sl_p99"
    fi
  done
done
