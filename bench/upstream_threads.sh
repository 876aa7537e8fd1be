#!/usr/bin/env bash
# How evenly a proxy serves its clients: pgbench -S through PgBouncer and through sluice with
# each `server.connection_threads` setting (one runtime per core, one thread, tokio's shared
# multi-threaded runtime), interleaved rounds. Besides TPS and p50/p99, each
# row shows how many transactions each client got (min / median / max over the clients, from
# pgbench's per-transaction log): a tail (p99) far above the median with an even split is
# queueing; with an uneven split, some clients are served many times faster than others.
#
#   bench/upstream_threads.sh [SECONDS] [CLIENTS] [ROUNDS]      (defaults 5, 64, 2)
#
# PROTOCOLS="simple prepared" (default "prepared") picks the protocols. SLUICE_BIN=path uses
# that binary instead of building one. Needs pgbench, pgbouncer and PostgreSQL's server
# binaries; loopback only, a temp dir.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/postgres.sh

seconds="${1:-5}"
clients="${2:-64}"
rounds="${3:-2}"
protocols="${PROTOCOLS:-prepared}"
need_tools pgbench initdb pg_ctl pgbouncer
bench_dir
pg_port=54344
release_sluice

start_pgbench_postgres "$pg_port" 400
start_pgbouncer session 6460
targets=("PgBouncer|6460")
port=6461
for threads in "$(nproc)" 1 0; do
  extra=$'[server]\nconnection_threads = '"$threads"
  SLUICE_TOML_EXTRA="$extra" start_upstream_sluice "sluice-threads-$threads" "$SLUICE_BIN" "$port" session
  case $threads in
    1) label="sluice, one thread" ;;
    0) label="sluice, shared runtime" ;;
    *) label="sluice, a runtime per core ($threads)" ;;
  esac
  targets+=("$label|$port")
  port=$((port + 1))
done

echo
echo "pgbench -S, $clients clients (-j $clients), ${seconds} s a run, session pooling, $rounds round(s), $(nproc) CPUs, $(date -u +%Y-%m-%d)"
echo
echo "| protocol | round | target | TPS | p50 / p99 ms | transactions per client: min / median / max |"
echo "|---|---|---|---|---|---|"
for protocol in $protocols; do
  for round in $(seq "$rounds"); do
    for target in "${targets[@]}"; do
      name=${target%|*} p=${target#*|}
      opts=""
      [ "$p" != 6460 ] && opts='-c workload=bench'
      rm -f "$work"/log.*
      out=$(cd "$work" && PGOPTIONS="$opts" pgbench -n -S -M "$protocol" -c "$clients" -j "$clients" \
        -T "$seconds" -l --log-prefix=log -h 127.0.0.1 -p "$p" -U bench postgres 2>&1 || true)
      tps=$(echo "$out" | awk '/^tps = / {printf "%.0f", $3}')
      if [ -z "$tps" ]; then
        echo "bench: pgbench against $name ($protocol) failed:" >&2
        echo "$out" >&2
        exit 1
      fi
      read -r p50 p99 < <(percentiles)
      spread=$(cat "$work"/log.* | awk '{n[$1]++} END {for (c in n) print n[c]}' | sort -n |
        awk '{a[NR] = $1} END {printf "%d / %d / %d", a[1], a[int((NR + 1) / 2)], a[NR]}')
      echo "| $protocol | $round | $name | $tps | $p50 / $p99 | $spread |"
    done
  done
done
