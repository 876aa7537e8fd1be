#!/usr/bin/env bash
# The proxy's CPU per transaction, PgBouncer vs sluice in upstream mode: pgbench -S at a fixed
# rate (so both do the same work in the same time), the proxy's user+system CPU read from
# /proc before and after. Unlike TPS on a machine where PostgreSQL, pgbench and the proxy share
# the cores, this figure hardly moves with the machine's noise: it is what a change to the
# forwarding path is judged by first (bench/upstream.sh then says what it does to TPS).
#
#   bench/upstream_cpu.sh [SECONDS_PER_RUN] [RATE] [CLIENTS]     (defaults 10, 3000, 8)
#
# SLUICE_BIN=path uses that binary instead of building one; SLUICE_BASELINE_BIN=path adds a
# second sluice (an older build) to the table. Needs pgbench, pgbouncer and PostgreSQL's server
# binaries; loopback only, a temp dir.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/postgres.sh

seconds="${1:-10}"
rate="${2:-3000}"
clients="${3:-8}"
for tool in pgbench initdb pg_ctl pgbouncer; do
  command -v "$tool" >/dev/null || {
    echo "bench: $tool not found (Debian: apt-get install pgbouncer postgresql)" >&2
    exit 2
  }
done

work="$(mktemp -d)"
pg_port=54341
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  stop_postgres
  rm -rf "$work"
}
trap cleanup EXIT

if [ -z "${SLUICE_BIN:-}" ]; then
  echo "== building sluice (release)" >&2
  cargo build --release --quiet --bin sluice
  SLUICE_BIN="${CARGO_TARGET_DIR:-target}/release/sluice"
fi

start_postgres "$pg_port" 200
pgbench -i -s 10 -q -h 127.0.0.1 -p "$pg_port" -U bench postgres >/dev/null 2>&1

# start_pgbouncer PORT MODE -> its pid in $started
start_pgbouncer() {
  local port=$1 mode=$2 dir="$work/pgbouncer-$2"
  mkdir -p "$dir"
  cat > "$dir/pgbouncer.ini" <<INI
[databases]
postgres = host=127.0.0.1 port=$pg_port user=bench dbname=postgres
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $port
unix_socket_dir =
auth_type = any
pool_mode = $mode
default_pool_size = 64
max_client_conn = 500
logfile = $dir/log
INI
  [ "$(id -u)" = 0 ] && chown -R postgres "$dir"
  if [ "$(id -u)" = 0 ]; then pgbouncer -u postgres "$dir/pgbouncer.ini" >/dev/null 2>&1 &
  else pgbouncer "$dir/pgbouncer.ini" >/dev/null 2>&1 & fi
  started=$!
  pids+=("$started")
  wait_port "$port"
}

# start_sluice NAME BIN PORT MODE -> its pid in $started
start_sluice() {
  local name=$1 bin=$2 port=$3 mode=$4 dir="$work/$1"
  mkdir -p "$dir"
  cat > "$dir/sluice.toml" <<TOML
[upstream]
url = "postgres://bench@127.0.0.1:$pg_port/postgres"
pool_size = 64
pool_mode = "$mode"

[catalog]
statements = """
CREATE RESOURCE slots (QUERY);
CREATE WORKLOAD all SETTINGS max_concurrent_queries = 1000;
CREATE WORKLOAD prod IN all SETTINGS priority = 0, weight = 3;
CREATE WORKLOAD bench IN prod;
CREATE WORKLOAD dev IN all SETTINGS priority = 1;
"""
TOML
  "$bin" serve --config "$dir/sluice.toml" --listen "127.0.0.1:$port" --data-dir "$dir/data" \
    >/dev/null 2>"$dir.log" &
  started=$!
  pids+=("$started")
  wait_port "$port"
}

wait_port() {
  for _ in $(seq 100); do
    (echo > "/dev/tcp/127.0.0.1/$1") 2>/dev/null && return
    sleep 0.1
  done
  echo "bench: nothing listens on $1" >&2; exit 1
}

# CPU ticks (user + system) of a process.
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# cpu_per_xact PID PORT PROTOCOL -> "µs_per_transaction transactions"
cpu_per_xact() {
  local pid=$1 port=$2 protocol=$3 before after out xacts opts=""
  [ "$port" -gt 6451 ] && opts='-c workload=bench'
  # A short warm-up: connections opened, statements prepared, caches filled.
  PGOPTIONS="$opts" pgbench -n -S -M "$protocol" -c "$clients" -j "$clients" -T 2 -R "$rate" \
    -h 127.0.0.1 -p "$port" -U bench postgres >/dev/null 2>&1 || true
  before=$(ticks "$pid")
  out=$(PGOPTIONS="$opts" pgbench -n -S -M "$protocol" -c "$clients" -j "$clients" -T "$seconds" -R "$rate" \
      -h 127.0.0.1 -p "$port" -U bench postgres 2>&1 || true)
  after=$(ticks "$pid")
  xacts=$(echo "$out" | awk '/^number of transactions actually processed/ {print $6}' | cut -d/ -f1)
  if [ -z "$xacts" ] || [ "$xacts" = 0 ]; then
    echo "bench: pgbench against port $port ($protocol) failed:" >&2
    echo "$out" >&2
    exit 1
  fi
  local hz
  hz=$(getconf CLK_TCK)
  awk -v t=$((after - before)) -v hz="$hz" -v n="$xacts" \
    'BEGIN {printf "%.1f %d\n", t / hz * 1e6 / n, n}'
}

echo "== PgBouncer ($(pgbouncer --version | head -1)), sluice ($SLUICE_BIN)" >&2
start_pgbouncer 6450 session; pgb_s=$started
start_pgbouncer 6451 transaction; pgb_t=$started
start_sluice sluice-session "$SLUICE_BIN" 6452 session; sl_s=$started
start_sluice sluice "$SLUICE_BIN" 6453 transaction; sl_t=$started
if [ -n "${SLUICE_BASELINE_BIN:-}" ]; then
  start_sluice baseline "$SLUICE_BASELINE_BIN" 6454 session; base=$started
fi

echo
echo "CPU per transaction, pgbench -S at $rate TPS, $clients clients, ${seconds} s per run, $(nproc) CPUs, $(date -u +%Y-%m-%d)"
echo
echo "PgBouncer 1.18 cannot run prepared statements in transaction pooling (pgbench's clients"
echo "abort): that cell is \"fails\"."
echo
echo "| protocol | PgBouncer session µs | sluice session µs |${SLUICE_BASELINE_BIN:+ baseline sluice session µs |} PgBouncer transaction µs | sluice transaction µs | sluice/PgBouncer session | transaction |"
echo "|---|---|---|${SLUICE_BASELINE_BIN:+---|}---|---|---|---|"
for protocol in simple prepared; do
  read -r bs _ < <(cpu_per_xact "$pgb_s" 6450 "$protocol")
  read -r ss _ < <(cpu_per_xact "$sl_s" 6452 "$protocol")
  extra=""
  if [ -n "${SLUICE_BASELINE_BIN:-}" ]; then
    read -r o _ < <(cpu_per_xact "$base" 6454 "$protocol")
    extra=" $o |"
  fi
  read -r st _ < <(cpu_per_xact "$sl_t" 6453 "$protocol")
  if [ "$protocol" = prepared ]; then
    bt=fails; rt="–"
  else
    read -r bt _ < <(cpu_per_xact "$pgb_t" 6451 "$protocol")
    rt=$(awk -v a="$st" -v b="$bt" 'BEGIN {printf "%.2f", a / b}')
  fi
  rs=$(awk -v a="$ss" -v b="$bs" 'BEGIN {printf "%.2f", a / b}')
  echo "| $protocol | $bs | $ss |$extra $bt | $st | $rs | $rt |"
done
