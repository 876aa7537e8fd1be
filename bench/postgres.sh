# Sourced by the pgbench scripts (pgbench.sh, upstream.sh): the machine's PostgreSQL in
# $work and pgbench's latency percentiles.
#   as_pg CMD                 runs CMD as the postgres user when we are root (initdb refuses root)
#   start_postgres PORT MAXC  initdb + start a trust-auth cluster in $work/pg on 127.0.0.1:PORT
#   stop_postgres             immediate stop (for cleanup traps)
#   percentiles               "p50_ms p99_ms" from pgbench's per-transaction logs $work/log.*
export PATH="$PATH:/usr/local/bin:/usr/sbin:$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | tail -1)"

as_pg() { if [ "$(id -u)" = 0 ]; then su postgres -s /bin/bash -c "$*"; else bash -c "$*"; fi; }

start_postgres() {
  local port=$1 max_connections=$2
  echo "== starting PostgreSQL ($(postgres --version 2>/dev/null || pg_ctl --version))" >&2
  if [ "$(id -u)" = 0 ]; then
    id postgres >/dev/null 2>&1 || useradd --system --no-create-home postgres
    chown postgres "$work"; chmod 755 "$work"
  fi
  as_pg "PATH='$PATH' initdb -D '$work/pg' -A trust -U bench >/dev/null"
  as_pg "PATH='$PATH' pg_ctl -D '$work/pg' -l '$work/pg.log' -w \
    -o \"-p $port -k '$work' -c listen_addresses=127.0.0.1 -c max_connections=$max_connections -c shared_buffers=128MB\" start >/dev/null"
}

stop_postgres() {
  as_pg "PATH='$PATH' pg_ctl -D '$work/pg' -m immediate stop" >/dev/null 2>&1 || true
}

percentiles() {
  # Per-transaction log: client xact latency_us script epoch epoch_us.
  cat "$work"/log.* | awk '{print $3}' | sort -n > "$work/lat"
  local n
  n=$(wc -l < "$work/lat")
  awk -v n="$n" 'NR == int(n * 0.50) + 1 {p50 = $1} NR == int(n * 0.99) + 1 {p99 = $1}
    END {printf "%.3f %.3f\n", p50 / 1000, p99 / 1000}' "$work/lat"
}
