#!/usr/bin/env bash
# Where a pgbench -S transaction's CPU goes on this machine, party by party: pgbench itself,
# PostgreSQL (its backends and what the postmaster reaped), and the proxy, each read from
# /proc before and after an unthrottled run (direct, through PgBouncer, through sluice with
# the three-level tree, session pooling). On a machine where all three share the cores, TPS
# at saturation is about (cores) / (the three together): the last column predicts it from
# them, beside what pgbench measured. What a proxy may cost a transaction for a target such as
# "≥ 0.8× direct" follows: 0.8× direct's TPS leaves (1/0.8 − 1) × direct's total per
# transaction for everything the proxy adds.
#
#   bench/upstream_budget.sh [SECONDS] [CLIENTS] [ROUNDS]      (defaults 5, 16, 1)
#
# SLUICE_BIN=path uses that binary instead of building one. Needs pgbench, pgbouncer and
# PostgreSQL's server binaries; loopback only, a temp dir.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/postgres.sh

seconds="${1:-5}"
clients="${2:-16}"
rounds="${3:-1}"
need_tools pgbench initdb pg_ctl pgbouncer pgrep /usr/bin/time
bench_dir
pg_port=54343
release_sluice

start_pgbench_postgres "$pg_port" 200
start_pgbouncer session 6456; pgbouncer_pid=$started
start_upstream_sluice sluice "$SLUICE_BIN" 6457 session; sluice_pid=$started
hz=$(getconf CLK_TCK)

# CPU ticks of PostgreSQL: every live server process, and what the postmaster reaped of
# backends that ended (direct connections end with each run).
postgres_ticks() {
  local postmaster
  postmaster=$(head -1 "$work/pg/postmaster.pid")
  {
    awk '{print $16 + $17}' "/proc/$postmaster/stat"
    for pid in $(pgrep -u postgres -x postgres); do
      awk '{print $14 + $15}' "/proc/$pid/stat" 2>/dev/null || true
    done
  } | awk '{s += $1} END {print s}'
}
# Until PostgreSQL's process count stops changing (backends of a run that ended exit, and are
# reaped, a moment after their client): read before that, their CPU would count in the next
# run or in none.
settle_postgres() {
  local last=-1 now
  for _ in $(seq 50); do
    now=$(pgrep -c -u postgres -x postgres || true)
    [ "$now" = "$last" ] && return
    last=$now
    sleep 0.2
  done
}
proxy_ticks() { if [ "$1" = 0 ]; then echo 0; else awk '{print $14 + $15}' "/proc/$1/stat"; fi; }

echo
echo "CPU per transaction by party, pgbench -S at saturation, $clients clients, ${seconds} s a run, $(nproc) CPUs, $(date -u +%Y-%m-%d)"
echo
echo "| protocol | target | TPS | pgbench µs | PostgreSQL µs | proxy µs | total µs | TPS predicted ($(nproc) cores / total) |"
echo "|---|---|---|---|---|---|---|---|"
for protocol in simple prepared; do
  for _ in $(seq "$rounds"); do
    for target in "direct $pg_port 0" "PgBouncer 6456 $pgbouncer_pid" "sluice 6457 $sluice_pid"; do
      set -- $target
      name=$1 port=$2 proxy=$3
      opts=""
      [ "$name" = sluice ] && opts='-c workload=bench'
      run=(pgbench -n -S -M "$protocol" -c "$clients" -j "$clients" -h 127.0.0.1 -p "$port" -U bench postgres)
      PGOPTIONS="$opts" "${run[@]}" -T 2 >/dev/null 2>&1 || true
      settle_postgres
      pg0=$(postgres_ticks); px0=$(proxy_ticks "$proxy")
      out=$( { PGOPTIONS="$opts" /usr/bin/time -f "TIME %U %S" "${run[@]}" -T "$seconds"; } 2>&1 || true)
      settle_postgres
      pg1=$(postgres_ticks); px1=$(proxy_ticks "$proxy")
      xacts=$(echo "$out" | awk '/^number of transactions actually processed/ {print $6}' | cut -d/ -f1)
      if [ -z "$xacts" ] || [ "$xacts" = 0 ]; then
        echo "bench: pgbench against $name ($protocol) failed:" >&2
        echo "$out" >&2
        exit 1
      fi
      read -r bench_user bench_sys < <(echo "$out" | awk '/^TIME/ {print $2, $3}')
      awk -v n="$xacts" -v hz="$hz" -v s="$seconds" -v bu="$bench_user" -v bs="$bench_sys" \
        -v pg=$((pg1 - pg0)) -v px=$((px1 - px0)) -v name="$name" -v protocol="$protocol" -v cores="$(nproc)" \
        'BEGIN {
          b = (bu + bs) * 1e6 / n; p = pg / hz * 1e6 / n; x = px / hz * 1e6 / n
          printf "| %s | %s | %.0f | %.1f | %.1f | %.1f | %.1f | %.0f |\n", protocol, name, n / s, b, p, x, b + p + x, cores * 1e6 / (b + p + x)
        }'
    done
  done
done
