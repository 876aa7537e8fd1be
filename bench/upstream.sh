#!/usr/bin/env bash
# pgbench -S (the read-only TPC-B-like script) side by side, one run on this machine:
# straight to PostgreSQL, through PgBouncer (session and transaction pooling) and through
# sluice in upstream mode (session and transaction pooling) with a three-level workload tree
# (all > prod > bench, a QUERY resource). For each protocol (simple, prepared) and client count
# (1, 16, 64): TPS and p50/p99 latency, with sluice's TPS as a ratio of PgBouncer's in the
# same pooling mode and of direct.
#
#   bench/upstream.sh [SECONDS_PER_RUN]      (default 10)
#
# ROUNDS=N (default 1) runs every cell's five targets N times in turn and reports the median
# of each figure, and of the per-round ratios: on a machine whose neighbours come and go, two
# runs side by side in the same round see the same noise, two minutes apart they do not.
#
# PROTOCOLS="simple" and CLIENTS="1 16" run only those rows (defaults: simple prepared; 1 16
# 64), to look closer at one cell with more rounds.
#
# SLUICE_BIN=path uses that binary instead of building one. Needs pgbench, pgbouncer
# (Debian's `pgbouncer`) and PostgreSQL's server binaries. Everything runs on loopback, in a
# temp dir. Every pool (PgBouncer's and sluice's) is 64 connections, so session pooling can
# seat every client.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/postgres.sh

seconds="${1:-10}"
rounds="${ROUNDS:-1}"
need_tools pgbench initdb pg_ctl pgbouncer
bench_dir
pg_port=54339
release_sluice

start_pgbench_postgres "$pg_port" 400

echo "== starting PgBouncer ($(pgbouncer --version | head -1)) and sluice ($SLUICE_BIN)" >&2
start_pgbouncer session 6441
start_pgbouncer transaction 6442
start_upstream_sluice sluice-session "$SLUICE_BIN" 6443 session
start_upstream_sluice sluice-transaction "$SLUICE_BIN" 6444 transaction

# run PORT MODE CLIENTS -> "tps p50_ms p99_ms"
run() {
  local port=$1 mode=$2 clients=$3
  rm -f "$work"/log.*
  local out
  out=$(cd "$work" && PGOPTIONS="$( { [ "$port" = 6443 ] || [ "$port" = 6444 ]; } && echo '-c workload=bench' )" \
    pgbench -n -S -M "$mode" -c "$clients" -j "$clients" -T "$seconds" \
      -h 127.0.0.1 -p "$port" -U bench -l --log-prefix=log postgres 2>&1 || true)
  local tps
  tps=$(echo "$out" | awk '/^tps = / {print $3}')
  if [ -z "$tps" ]; then
    echo "bench: pgbench against port $port ($mode, $clients clients) failed:" >&2
    echo "$out" >&2
    exit 1
  fi
  # A run whose transactions failed or whose clients aborted (PgBouncer before 1.21 with
  # prepared statements in transaction pooling) is marked: its figures are not of real work.
  local failed
  failed=$(echo "$out" | awk '/^number of failed transactions/ {print $5}')
  if { [ -n "$failed" ] && [ "$failed" != 0 ]; } || echo "$out" | grep -q "aborted"; then
    tps="${tps}!"
  fi
  local p50 p99
  read -r p50 p99 < <(percentiles)
  echo "$tps $p50 $p99"
}

# whole TPS -> the figure rounded, its "!" (failed transactions) kept.
whole() { local v=${1%!}; printf "%.0f%s" "$v" "${1#"$v"}"; }

# col N RESULT… -> field N of each "tps p50 p99" result, one a line, a "!" dropped
col() { local n=$1; shift; printf '%s\n' "$@" | awk -v n="$n" '{v = $n; sub(/!$/, "", v); print v}'; }
# median of the numbers on stdin
median() { sort -g | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'; }
# summary RESULT… -> "tps p50 p99", each the median over the rounds; "!" if any round had one
summary() {
  local mark
  mark=$(printf '%s\n' "$@" | awk '$1 ~ /!$/ {m = "!"} END {print m}')
  echo "$(col 1 "$@" | median)$mark $(col 2 "$@" | median) $(col 3 "$@" | median)"
}
# ratio A_RESULTS B_RESULTS -> the median over the rounds of A's TPS / B's TPS (the arrays
# passed by name)
ratio() {
  local -n a=$1 b=$2
  paste <(col 1 "${a[@]}") <(col 1 "${b[@]}") | awk '{printf "%.4f\n", $1 / $2}' | median |
    awk '{printf "%.2f", $1}'
}

echo
echo "pgbench -S, scale 10, ${seconds} s per run, $rounds round(s) (medians), $(nproc) CPUs, $(date -u +%Y-%m-%d)"
echo
echo "TPS marked ! : transactions failed or clients aborted in that run (not comparable)."
echo
echo "| protocol | clients | pooling | direct TPS | PgBouncer TPS | sluice TPS | sluice/PgBouncer | sluice/direct | PgBouncer p50 / p99 ms | sluice p50 / p99 ms | direct p50 / p99 ms |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
for mode in ${PROTOCOLS:-simple prepared}; do
  for clients in ${CLIENTS:-1 16 64}; do
    direct=(); b_session=(); s_session=(); b_transaction=(); s_transaction=()
    for _ in $(seq "$rounds"); do
      direct+=("$(run "$pg_port" "$mode" "$clients")")
      b_session+=("$(run 6441 "$mode" "$clients")")
      s_session+=("$(run 6443 "$mode" "$clients")")
      b_transaction+=("$(run 6442 "$mode" "$clients")")
      s_transaction+=("$(run 6444 "$mode" "$clients")")
    done
    read -r d_tps d_p50 d_p99 < <(summary "${direct[@]}")
    for pooling in session transaction; do
      declare -n b_runs="b_$pooling" s_runs="s_$pooling"
      read -r b_tps b_p50 b_p99 < <(summary "${b_runs[@]}")
      read -r s_tps s_p50 s_p99 < <(summary "${s_runs[@]}")
      vs_b=$(ratio "s_$pooling" "b_$pooling")
      vs_d=$(ratio "s_$pooling" direct)
      unset -n b_runs s_runs
      printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s / %s | %s / %s | %s / %s |\n" \
        "$mode" "$clients" "$pooling" "$(whole "$d_tps")" "$(whole "$b_tps")" "$(whole "$s_tps")" "$vs_b" "$vs_d" \
        "$b_p50" "$b_p99" "$s_p50" "$s_p99" "$d_p50" "$d_p99"
    done
  done
done
