#!/usr/bin/env bash
# sluice's user-space instructions per forwarded transaction (valgrind's callgrind): pgbench -S
# through sluice in upstream mode (session pooling, the three-level tree), simple and prepared.
# Instruction counts do not move with the machine's load the way CPU time and TPS do on a
# shared host (repeat runs agree within ~2%), so this is the figure that tells whether a change
# to the per-statement path made it cheaper; the kernel's share (the sends, the wakeups) is not
# in it: bench/upstream_cpu.sh shows the whole.
#
#   bench/upstream_instructions.sh [TRANSACTIONS_PER_CLIENT]      (default 1000, 4 clients)
#
# CLIENTS=n sets the clients (default 4; at most 45: the benchmark's PostgreSQL takes 50
# connections, and session pooling gives each client its own).
#
# SLUICE_BIN=path uses that binary; SLUICE_BASELINE_BIN=path measures a second one beside it;
# PGBOUNCER=1 adds PgBouncer's count (session pooling; needs pgbouncer). RELAYS=1 adds the
# bare relays of bench/relay_floor (tokio, poll, threads: bytes passed, nothing else), the
# floor of each design a forwarding core could be built on. (Not its uring relay: valgrind
# 3.19 hangs it; bench/upstream_cpu.sh RELAYS=1 SPLIT=1 shows its user time.)
# POOL_MODE=transaction measures sluice in transaction pooling (a connection lent and given
# back at each transaction; PgBouncer's and the relays' figures stay session pooling's).
# KEEP_PROFILES=dir keeps each run's callgrind output there (dir/NAME-PROTOCOL.out, NAME the
# binary's file name), for `callgrind_annotate --inclusive=yes`.
# Needs valgrind, pgbench and PostgreSQL's server binaries; loopback only, a temp dir.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/postgres.sh

per_client="${1:-1000}"
pool_mode="${POOL_MODE:-session}"
clients="${CLIENTS:-4}"
need_tools pgbench initdb pg_ctl valgrind callgrind_control
bench_dir
pg_port=54342
release_sluice
start_pgbench_postgres "$pg_port" 50

# counted PID PORT PROTOCOL OUT NAME [PGOPTIONS] -> instructions per transaction of the
# process PID (started under callgrind with --instr-atstart=no, writing OUT), counted after a
# warm-up; NAME names the kept profile.
counted() {
  local pid=$1 port=$2 protocol=$3 out=$4 name=$5 opts=${6:-}
  local run=(pgbench -n -S -M "$protocol" -c "$clients" -j "$clients" -h 127.0.0.1 -p "$port" -U bench postgres)
  # The warm-up fills system.query_log (10,000 rows by default), so that what is counted is a
  # statement's steady cost (a row in, the oldest out), not the log's growing.
  PGOPTIONS="$opts" "${run[@]}" -t 2600 >/dev/null 2>&1
  callgrind_control -i on "$pid" >/dev/null 2>&1
  PGOPTIONS="$opts" "${run[@]}" -t "$per_client" >/dev/null 2>&1
  callgrind_control -i off "$pid" >/dev/null 2>&1
  callgrind_control -d "$pid" >/dev/null 2>&1
  sleep 1
  kill "$pid"; wait "$pid" 2>/dev/null || true
  if [ -n "${KEEP_PROFILES:-}" ]; then
    mkdir -p "$KEEP_PROFILES"
    cp "$(ls -S "$out"* | head -1)" "$KEEP_PROFILES/$name-$protocol.out"
  fi
  # The dump's part (the part written at exit counted nothing: counting was off by then).
  cat "$out"* | awk -v n=$((clients * per_client)) \
    '/^totals:/ {if ($2 > m) m = $2} END {printf "%d\n", m / n}'
}

# instructions BIN PROTOCOL -> sluice's instructions per transaction
instructions() {
  local bin=$1 protocol=$2 out="$work/callgrind.$RANDOM"
  SLUICE_WRAPPER="valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file=$out" \
    start_upstream_sluice "cg-$RANDOM" "$bin" 6455 "$pool_mode"
  counted "$started" 6455 "$protocol" "$out" "$(basename "$bin")" '-c workload=bench'
}

# relay_instructions MODE PROTOCOL -> the bare relay's (bench/relay_floor) per transaction
relay_instructions() {
  local mode=$1 protocol=$2 out="$work/callgrind.relay.$RANDOM"
  RELAY_WRAPPER="valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file=$out" \
    start_relay "$mode" 6440
  counted "$started" 6440 "$protocol" "$out" "relay-$mode"
}

# pgbouncer_instructions PROTOCOL -> PgBouncer's instructions per transaction: two runs under
# callgrind, of 500 and of 2,500 transactions per client, each counted whole (start-up,
# connections and all) and subtracted, so what is left is 8,000 transactions' steady cost.
pgbouncer_instructions() {
  local protocol=$1 totals=() n out
  for n in 500 2500; do
    out="$work/pgbouncer-session/callgrind.$n"
    PGBOUNCER_WRAPPER="valgrind --tool=callgrind --callgrind-out-file=$out" start_pgbouncer session 6458
    pgbench -n -S -M "$protocol" -c "$clients" -j "$clients" -h 127.0.0.1 -p 6458 -U bench postgres \
      -t "$n" >/dev/null 2>&1
    kill "$started"; wait "$started" 2>/dev/null || true
    totals+=("$(awk '/^totals:/ {print $2}' "$out")")
  done
  echo $(( (totals[1] - totals[0]) / (clients * 2000) ))
}

echo
echo "sluice's user-space instructions per transaction (callgrind), pgbench -S, $clients clients × $per_client transactions, $pool_mode pooling, $(date -u +%Y-%m-%d)"
echo
[ -n "${RELAYS:-}" ] && relay_floor_bin
echo "| protocol | sluice |${SLUICE_BASELINE_BIN:+ baseline | sluice/baseline |}${PGBOUNCER:+ PgBouncer | sluice/PgBouncer |}${RELAYS:+ relay tokio | relay poll | relay threads |}"
echo "|---|---|${SLUICE_BASELINE_BIN:+---|---|}${PGBOUNCER:+---|---|}${RELAYS:+---|---|---|}"
for protocol in simple prepared; do
  now=$(instructions "$SLUICE_BIN" "$protocol")
  row="| $protocol | $now |"
  if [ -n "${SLUICE_BASELINE_BIN:-}" ]; then
    base=$(instructions "$SLUICE_BASELINE_BIN" "$protocol")
    row+=" $base | $(awk -v a="$now" -v b="$base" 'BEGIN {printf "%.2f", a / b}') |"
  fi
  if [ -n "${PGBOUNCER:-}" ]; then
    bouncer=$(pgbouncer_instructions "$protocol")
    row+=" $bouncer | $(awk -v a="$now" -v b="$bouncer" 'BEGIN {printf "%.2f", a / b}') |"
  fi
  if [ -n "${RELAYS:-}" ]; then
    for mode in tokio poll threads; do row+=" $(relay_instructions "$mode" "$protocol") |"; done
  fi
  echo "$row"
done
