#!/usr/bin/env bash
# System calls per forwarded transaction, PgBouncer's beside sluice's: pgbench -S (4 clients,
# session pooling, the three-level tree) with `strace -c -f` attached to each proxy in turn.
# Counts, not times (strace slows the proxy down; what it calls per transaction is unchanged),
# so it tells whether sluice's gap to PgBouncer is in how it talks to the kernel (extra reads
# that find nothing, wake-ups between threads, writes split in two) or in its own work, which
# bench/upstream_instructions.sh counts.
#
#   bench/upstream_syscalls.sh [TRANSACTIONS_PER_CLIENT]      (default 2000)
#
# SLUICE_BIN=path uses that binary; RELAYS=1 adds the bare relays of bench/relay_floor (poll:
# epoll as PgBouncer; uring: io_uring). Needs strace, pgbench, pgbouncer and PostgreSQL's server
# binaries; loopback only, a temp dir.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/postgres.sh

per_client="${1:-2000}"
clients=4
need_tools pgbench pgbouncer initdb pg_ctl strace
bench_dir
pg_port=54343
release_sluice
start_pgbench_postgres "$pg_port" 50
start_pgbouncer session 6440
bouncer=$started
start_upstream_sluice sluice "$SLUICE_BIN" 6455 session
sluice=$started
relays=()
if [ -n "${RELAYS:-}" ]; then
  relay_floor_bin
  start_relay poll 6441; relays+=("relay-poll $started 6441")
  start_relay uring 6442; relays+=("relay-uring $started 6442")
fi

# calls NAME PID PORT PROTOCOL OPTIONS -> "syscall calls-per-transaction" lines, most first
calls() {
  local name=$1 pid=$2 port=$3 protocol=$4 options=$5 out="$work/strace.$1.$4"
  local run=(pgbench -n -S -M "$protocol" -c "$clients" -j "$clients" -h 127.0.0.1 -p "$port" -U bench postgres)
  PGOPTIONS="$options" "${run[@]}" -t 200 >/dev/null 2>&1
  strace -c -f -p "$pid" -o "$out" 2>/dev/null &
  local tracer=$!
  sleep 1
  PGOPTIONS="$options" "${run[@]}" -t "$per_client" >/dev/null 2>&1
  kill -INT "$tracer"
  wait "$tracer" 2>/dev/null || true
  awk -v n=$((clients * per_client)) '$1 ~ /^[0-9.]+$/ && NF >= 5 && $NF != "total" && $4 / n >= 0.01 {
    printf "%s %.2f\n", $NF, $4 / n }' "$out" | sort -k2 -nr
}

echo
echo "System calls per transaction (strace -c -f), pgbench -S, $clients clients × $per_client transactions, session pooling, $(date -u +%Y-%m-%d)"
echo
echo "| protocol | proxy | calls per transaction (≥ 0.01) |"
echo "|---|---|---|"
for protocol in simple prepared; do
  # PgBouncer refuses start-up options it does not know; sluice takes the workload from them.
  for target in "PgBouncer $bouncer 6440" "sluice $sluice 6455 -c workload=bench" "${relays[@]}"; do
    read -r name pid port options <<<"$target"
    echo "| $protocol | $name | $(calls "$name" "$pid" "$port" "$protocol" "${options:-}" | awk '{printf "%s%s %s", (NR > 1 ? ", " : ""), $1, $2}') |"
  done
done
