# Sourced by the pgbench scripts (pgbench.sh, upstream.sh, upstream_cpu.sh): the machine's
# PostgreSQL in $work, the proxies in front of it, and pgbench's latency percentiles.
#   need_tools TOOL…          exits 2 naming the first tool not on PATH
#   bench_dir                 $work (a temp dir) and an exit trap that kills every pid in
#                             $pids, stops PostgreSQL and removes $work
#   release_sluice            $SLUICE_BIN, built (release) unless it is set
#   as_pg CMD                 runs CMD as the postgres user when we are root (initdb refuses root)
#   start_postgres PORT MAXC  initdb + start a trust-auth cluster in $work/pg on 127.0.0.1:PORT
#   start_pgbench_postgres PORT MAXC   the same, with pgbench's tables (`pgbench -i -s 10`)
#   stop_postgres             immediate stop (for cleanup traps)
#   percentiles               "p50_ms p99_ms" from pgbench's per-transaction logs $work/log.*
#   start_pgbouncer MODE PORT   PgBouncer (pool_mode MODE, 64 connections) in front of
#                               $pg_port; its pid in $started (and in $pids);
#                               $PGBOUNCER_WRAPPER, if set, is the command it runs under
#   start_upstream_sluice NAME BIN PORT MODE
#                             sluice --upstream to $pg_port (pool_mode MODE, 64 connections)
#                             with a three-level tree (all > prod > bench, a QUERY resource);
#                             its pid in $started (and in $pids); $SLUICE_WRAPPER, if set,
#                             is the command it runs under (valgrind …); $SLUICE_TOML_EXTRA,
#                             if set, is appended to its config (a `[server]` table, say)
export PATH="$PATH:/usr/local/bin:/usr/sbin:$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | tail -1)"

# server_session: every server here runs in a session of its own (`setsid`), as it would as a
# service: pg_ctl starts PostgreSQL so, and the proxies are started so too. Linux's autogroup
# scheduling (on by default) shares the CPU between sessions first, then between the tasks of
# each; a proxy left in the benchmark script's session would share one group with pgbench's
# threads, and compete with the load generator instead of beside it (BENCHMARKS.md, "The
# harness fixed, one connection thread on two cores").

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

start_pgbench_postgres() {
  start_postgres "$1" "$2"
  pgbench -i -s 10 -q -h 127.0.0.1 -p "$1" -U bench postgres >/dev/null 2>&1
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

need_tools() {
  for tool in "$@"; do
    command -v "$tool" >/dev/null || {
      echo "bench: $tool not found (Debian: apt-get install pgbouncer postgresql postgresql-contrib)" >&2
      exit 2
    }
  done
}

bench_dir() {
  work="$(mktemp -d)"
  pids=()
  trap bench_cleanup EXIT
}

bench_cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  stop_postgres
  rm -rf "$work"
}

release_sluice() {
  if [ -z "${SLUICE_BIN:-}" ]; then
    echo "== building sluice (release)" >&2
    cargo build --release --quiet --bin sluice
    SLUICE_BIN="${CARGO_TARGET_DIR:-target}/release/sluice"
  fi
}

wait_for_port() {
  for _ in $(seq 100); do
    (echo > "/dev/tcp/127.0.0.1/$1") 2>/dev/null && return
    sleep 0.1
  done
  echo "bench: nothing listens on port $1" >&2
  exit 1
}

start_pgbouncer() {
  local mode=$1 port=$2 dir="$work/pgbouncer-$1"
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
  # In a session of its own, as a server runs (see `server_session`).
  # shellcheck disable=SC2086 # the wrapper is a command with its arguments
  if [ -n "${PGBOUNCER_WRAPPER:-}" ] && [ "$(id -u)" = 0 ]; then
    # The wrapper (valgrind) runs as the user PgBouncer ends up as, so that what it writes at
    # the end can be written; setpriv execs, so the pid is PgBouncer's own.
    setsid setpriv --reuid=postgres --regid=postgres --clear-groups $PGBOUNCER_WRAPPER pgbouncer "$dir/pgbouncer.ini" >/dev/null 2>&1 &
  elif [ "$(id -u)" = 0 ]; then setsid pgbouncer -u postgres "$dir/pgbouncer.ini" >/dev/null 2>&1 &
  else setsid ${PGBOUNCER_WRAPPER:-} pgbouncer "$dir/pgbouncer.ini" >/dev/null 2>&1 & fi
  started=$!
  pids+=("$started")
  wait_for_port "$port"
}

start_upstream_sluice() {
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
${SLUICE_TOML_EXTRA:-}
TOML
  # In a session of its own, as a server runs (see `server_session`).
  # shellcheck disable=SC2086 # the wrapper is a command with its arguments
  setsid ${SLUICE_WRAPPER:-} "$bin" serve --config "$dir/sluice.toml" --listen "127.0.0.1:$port" \
    --data-dir "$dir/data" >/dev/null 2>"$dir.log" &
  started=$!
  pids+=("$started")
  wait_for_listening "$dir.log" "sluice ($name)"
}

# wait_for_listening LOG WHAT: until LOG says "listening on" (60 s), else says WHAT did not start.
wait_for_listening() {
  for _ in $(seq 600); do
    grep -q "listening on" "$1" 2>/dev/null && return
    sleep 0.1
  done
  echo "bench: $2 did not start" >&2
  cat "$1" >&2
  exit 1
}

# relay_floor_bin -> builds bench/relay_floor (a bare relay, four designs) and sets $relay_bin.
relay_floor_bin() {
  local target="${CARGO_TARGET_DIR:-$PWD/target}/relay-floor"
  echo "== building bench/relay_floor (release)" >&2
  cargo build --release --quiet --manifest-path bench/relay_floor/Cargo.toml --target-dir "$target"
  relay_bin="$target/release/relay-floor"
}

# start_relay MODE PORT: the bare relay (tokio | poll | threads | uring) from PORT to PostgreSQL, in a
# session of its own; RELAY_WRAPPER (valgrind) runs it if set. Sets $started.
start_relay() {
  local mode=$1 port=$2
  # shellcheck disable=SC2086 # the wrapper is a command with its arguments
  setsid ${RELAY_WRAPPER:-} "$relay_bin" "$mode" "127.0.0.1:$port" "127.0.0.1:$pg_port" \
    >/dev/null 2>"$work/relay-$mode-$port.log" &
  started=$!
  pids+=("$started")
  wait_for_listening "$work/relay-$mode-$port.log" "the $mode relay"
}
