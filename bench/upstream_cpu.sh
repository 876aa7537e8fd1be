#!/usr/bin/env bash
# The proxy's CPU per transaction, PgBouncer vs sluice in upstream mode: pgbench -S at a fixed
# rate (so both do the same work in the same time), the proxy's user+system CPU read from
# /proc before and after. Unlike TPS on a machine where PostgreSQL, pgbench and the proxy share
# the cores, this figure hardly moves with the machine's noise: it is what a change to the
# forwarding path is judged by first (bench/upstream.sh then says what it does to TPS).
#
#   bench/upstream_cpu.sh [SECONDS_PER_RUN] [RATE] [CLIENTS]     (defaults 10, 3000, 8)
#
# RATE=max runs pgbench unthrottled instead: each cell then shows "µs (TPS)", what the proxy
# spends per transaction at saturation and the throughput it got (compare builds that way
# only in interleaved runs: on a shared machine TPS moves with the neighbours).
#
# SPLIT=1 shows each cell as "total (user + system)" µs, the process's utime and stime apart
# (tick-sampled by the kernel: the split is rough, the sum is the figure). FAULTS=1 adds the
# process's minor page faults per transaction as "[faults]": kernel time no system call shows.
#
# SLUICE_BIN=path uses that binary instead of building one; SLUICE_BASELINE_BIN=path adds a
# second sluice (an older build) to the table; RELAYS=1 adds the bare relays of
# bench/relay_floor (tokio, poll, threads, uring: bytes passed, nothing else), session-like. Needs pgbench, pgbouncer and PostgreSQL's server
# binaries; loopback only, a temp dir.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/postgres.sh

seconds="${1:-10}"
rate="${2:-3000}"
clients="${3:-8}"
need_tools pgbench initdb pg_ctl pgbouncer
bench_dir
pg_port=54341
release_sluice

start_pgbench_postgres "$pg_port" 200

# CPU ticks of a process: user, system; and its minor page faults.
ticks() { awk '{print $14, $15, $10}' "/proc/$1/stat"; }

# cpu_per_xact PID PORT PROTOCOL -> "µs_per_transaction transactions"
cpu_per_xact() {
  local pid=$1 port=$2 protocol=$3 out xacts opts="" throttle=()
  [ "$rate" != max ] && throttle=(-R "$rate")
  [ "$port" -gt 6451 ] && opts='-c workload=bench'
  # A short warm-up: connections opened, statements prepared, caches filled.
  PGOPTIONS="$opts" pgbench -n -S -M "$protocol" -c "$clients" -j "$clients" -T 2 "${throttle[@]}" \
    -h 127.0.0.1 -p "$port" -U bench postgres >/dev/null 2>&1 || true
  local user0 sys0 user1 sys1 flt0 flt1
  read -r user0 sys0 flt0 < <(ticks "$pid")
  out=$(PGOPTIONS="$opts" pgbench -n -S -M "$protocol" -c "$clients" -j "$clients" -T "$seconds" "${throttle[@]}" \
      -h 127.0.0.1 -p "$port" -U bench postgres 2>&1 || true)
  read -r user1 sys1 flt1 < <(ticks "$pid")
  xacts=$(echo "$out" | awk '/^number of transactions actually processed/ {print $6}' | cut -d/ -f1)
  if [ -z "$xacts" ] || [ "$xacts" = 0 ]; then
    echo "bench: pgbench against port $port ($protocol) failed:" >&2
    echo "$out" >&2
    exit 1
  fi
  local hz
  hz=$(getconf CLK_TCK)
  awk -v u=$((user1 - user0)) -v s=$((sys1 - sys0)) -v hz="$hz" -v n="$xacts" -v apart="${SPLIT:-}" \
    -v f=$((flt1 - flt0)) -v faults="${FAULTS:-}" \
    'BEGIN {
       total = sprintf("%.1f", (u + s) / hz * 1e6 / n)
       if (apart != "") total = total "(" sprintf("%.0f+%.0f", u / hz * 1e6 / n, s / hz * 1e6 / n) ")"
       if (faults != "") total = total "[" sprintf("%.3f", f / n) "]"
       printf "%s %d\n", total, n
     }'
}

# cell µs TRANSACTIONS -> what a table cell shows
cell() {
  if [ "$rate" = max ]; then echo "$1 ($(($2 / seconds)))"; else echo "$1"; fi
}

echo "== PgBouncer ($(pgbouncer --version | head -1)), sluice ($SLUICE_BIN)" >&2
start_pgbouncer session 6450; pgb_s=$started
start_pgbouncer transaction 6451; pgb_t=$started
start_upstream_sluice sluice-session "$SLUICE_BIN" 6452 session; sl_s=$started
start_upstream_sluice sluice-transaction "$SLUICE_BIN" 6453 transaction; sl_t=$started
if [ -n "${SLUICE_BASELINE_BIN:-}" ]; then
  start_upstream_sluice baseline "$SLUICE_BASELINE_BIN" 6454 session; base=$started
fi
relay_modes=(); relay_pids=()
if [ -n "${RELAYS:-}" ]; then
  relay_floor_bin
  relay_modes=(tokio poll threads uring)
  for i in 0 1 2 3; do start_relay "${relay_modes[$i]}" $((6440 + i)); relay_pids+=("$started"); done
fi

echo
echo "CPU per transaction, pgbench -S at $rate TPS ($([ "$rate" = max ] && echo "µs (TPS) a cell" || echo "µs a cell")), $clients clients, ${seconds} s per run, $(nproc) CPUs, $(date -u +%Y-%m-%d)"
echo
echo "PgBouncer 1.18 cannot run prepared statements in transaction pooling (pgbench's clients"
echo "abort): that cell is \"fails\"."
echo
echo "| protocol | PgBouncer session µs | sluice session µs |${SLUICE_BASELINE_BIN:+ baseline sluice session µs |} PgBouncer transaction µs | sluice transaction µs | sluice/PgBouncer session | transaction |${RELAYS:+ relay tokio µs | relay poll µs | relay threads µs | relay uring µs |}"
echo "|---|---|---|${SLUICE_BASELINE_BIN:+---|}---|---|---|---|${RELAYS:+---|---|---|---|}"
for protocol in simple prepared; do
  read -r bs bn < <(cpu_per_xact "$pgb_s" 6450 "$protocol")
  read -r ss sn < <(cpu_per_xact "$sl_s" 6452 "$protocol")
  extra=""
  if [ -n "${SLUICE_BASELINE_BIN:-}" ]; then
    read -r o on < <(cpu_per_xact "$base" 6454 "$protocol")
    extra=" $(cell "$o" "$on") |"
  fi
  read -r st tn < <(cpu_per_xact "$sl_t" 6453 "$protocol")
  if [ "$protocol" = prepared ]; then
    btc=fails; rt="–"
  else
    read -r bt btn < <(cpu_per_xact "$pgb_t" 6451 "$protocol")
    btc=$(cell "$bt" "$btn")
    rt=$(awk -v a="$st" -v b="$bt" 'BEGIN {printf "%.2f", a / b}')
  fi
  rs=$(awk -v a="$ss" -v b="$bs" 'BEGIN {printf "%.2f", a / b}')
  relays=""
  for i in "${!relay_modes[@]}"; do
    read -r r rn < <(cpu_per_xact "${relay_pids[$i]}" $((6440 + i)) "$protocol")
    relays+=" $(cell "$r" "$rn") |"
  done
  echo "| $protocol | $(cell "$bs" "$bn") | $(cell "$ss" "$sn") |$extra $btc | $(cell "$st" "$tn") | $rs | $rt |$relays"
done
