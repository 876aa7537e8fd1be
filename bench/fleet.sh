#!/usr/bin/env bash
# The fleet's costs, in one run on this machine (issue 37):
#   1. SELECT 1 through pgbench against one sluice alone and against one node of a three-node
#      fleet on a three-member etcd (release builds, embedded engine, a QUERY resource with a
#      limit that never binds): TPS and latency side by side, and the fleet's ratio;
#   2. etcd's traffic (messages its members received, per second, summed over the three, from
#      their /metrics) while the fleet is idle, and while it is busy: 16 pgbench clients on each
#      node against a limit of 8 across the fleet, so that shares move all the time;
#   3. a rate across the fleet (max_queries_per_second = 1000, 16 clients on each node): the
#      fleet's TPS against the rate, and etcd's traffic meanwhile;
#   4. clusterAllReplicas: `SELECT count(*) FROM clusterAllReplicas('default', system.processes)`
#      on one node (asking the two others through etcd) against `system.processes` alone, one
#      client: TPS and latency.
#
#   SECTIONS="1 2 3 4" (default) picks the sections to run.
#
#   bench/fleet.sh [SECONDS_PER_RUN]      (default 10)
#
# SLUICE_BIN=path uses that binary (built with `--features cluster`) instead of building one.
# Needs etcd (Debian: etcd-server), pgbench and psql. Everything runs on loopback, in a temp dir.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/postgres.sh

seconds="${1:-10}"
need_tools pgbench psql etcd
bench_dir
if [ -z "${SLUICE_BIN:-}" ]; then
  echo "== building sluice (release, with the fleet)" >&2
  cargo build --release --quiet --features cluster --bin sluice
  SLUICE_BIN="${CARGO_TARGET_DIR:-target}/release/sluice"
fi

# A three-member etcd cluster on loopback.
cluster=""
for i in 0 1 2; do
  cluster+="${cluster:+,}e$i=http://127.0.0.1:$((23800 + i))"
done
for i in 0 1 2; do
  setsid etcd --name "e$i" --data-dir "$work/e$i" \
    --listen-client-urls "http://127.0.0.1:$((23790 + i))" \
    --advertise-client-urls "http://127.0.0.1:$((23790 + i))" \
    --listen-peer-urls "http://127.0.0.1:$((23800 + i))" \
    --initial-advertise-peer-urls "http://127.0.0.1:$((23800 + i))" \
    --initial-cluster "$cluster" --initial-cluster-state new \
    >"$work/e$i.log" 2>&1 &
  pids+=($!)
done
endpoints='"http://127.0.0.1:23790", "http://127.0.0.1:23791", "http://127.0.0.1:23792"'
for _ in $(seq 100); do
  curl -sf http://127.0.0.1:23790/health | grep -q true && break
  sleep 0.2
done

# start_node NAME PORT [cluster] -> pid
start_node() {
  local name=$1 port=$2 fleet=${3:-}
  mkdir -p "$work/$name"
  : > "$work/$name.toml"
  if [ -n "$fleet" ]; then
    printf '[cluster]\netcd = [%s]\nprefix = "/bench"\nnode = "%s"\n' "$endpoints" "$name" \
      > "$work/$name.toml"
  fi
  setsid "$SLUICE_BIN" serve --config "$work/$name.toml" --listen "127.0.0.1:$port" \
    --data-dir "$work/$name/data" >/dev/null 2>"$work/$name.log" &
  local pid=$!
  for _ in $(seq 100); do
    grep -q "listening on" "$work/$name.log" 2>/dev/null && { echo "$pid"; return; }
    sleep 0.1
  done
  echo "bench: sluice $name did not start:" >&2
  cat "$work/$name.log" >&2
  exit 1
}

echo "== starting sluice alone and a fleet of three ($SLUICE_BIN)" >&2
pids+=("$(start_node alone 6561)")
for i in 1 2 3; do
  pids+=("$(start_node "n$i" $((6570 + i)) fleet)")
done
ddl() { psql -X -q -h 127.0.0.1 -p "$1" -U bench -d bench -c "$2" >/dev/null; }
for port in 6561 6571; do
  ddl "$port" "CREATE RESOURCE slots (QUERY)"
  ddl "$port" "CREATE WORKLOAD all SETTINGS max_concurrent_queries = 1000"
  ddl "$port" "CREATE WORKLOAD open IN all"
done
ddl 6571 "CREATE WORKLOAD tight IN all SETTINGS max_concurrent_queries = 8"
ddl 6571 "CREATE WORKLOAD rated IN all SETTINGS max_queries_per_second = 1000, max_burst_queries = 100"
echo 'SELECT 1;' > "$work/select1.sql"
echo "SELECT count(*) FROM clusterAllReplicas('default', system.processes);" > "$work/fleet_view.sql"
echo 'SELECT count(*) FROM system.processes;' > "$work/local_view.sql"
sections="${SECTIONS:-1 2 3 4}"
section() { [[ " $sections " == *" $1 "* ]]; }
sleep 1

# run PORT MODE CLIENTS WORKLOAD [SCRIPT] -> "tps p50_ms p99_ms"
run() {
  local port=$1 mode=$2 clients=$3 workload=$4 script=${5:-select1.sql}
  rm -f "$work"/log.*
  local out tps
  out=$(cd "$work" && PGOPTIONS="-c workload=$workload" \
    pgbench -n -M "$mode" -c "$clients" -j "$clients" -T "$seconds" -f "$script" \
      -h 127.0.0.1 -p "$port" -U bench -l --log-prefix=log postgres 2>&1 || true)
  tps=$(echo "$out" | awk '/^tps = / {print $3}')
  if [ -z "$tps" ]; then
    echo "bench: pgbench against port $port failed:" >&2
    echo "$out" >&2
    exit 1
  fi
  local p50 p99
  read -r p50 p99 < <(percentiles)
  echo "$tps $p50 $p99"
}

# etcd_messages -> messages received by the three members so far
etcd_messages() {
  local total=0 n
  for i in 0 1 2; do
    n=$(curl -s "http://127.0.0.1:$((23790 + i))/metrics" |
      awk '/^grpc_server_msg_received_total/ {s += $2} END {printf "%d", s}')
    total=$((total + n))
  done
  echo "$total"
}

if section 1; then
echo
echo "sluice alone vs one node of a three-node fleet: pgbench SELECT 1, ${seconds} s per run, $(nproc) CPUs, $(date -u +%Y-%m-%d)"
echo
echo "| protocol | clients | alone TPS | fleet node TPS | fleet/alone | alone p50 ms | fleet p50 ms | alone p99 ms | fleet p99 ms |"
echo "|---|---|---|---|---|---|---|---|---|"
for mode in simple extended; do
  for clients in 1 16 64; do
    read -r a_tps a_p50 a_p99 < <(run 6561 "$mode" "$clients" open)
    read -r f_tps f_p50 f_p99 < <(run 6571 "$mode" "$clients" open)
    ratio=$(awk -v a="$f_tps" -v b="$a_tps" 'BEGIN {printf "%.2f", a / b}')
    printf "| %s | %s | %.0f | %.0f | %s | %s | %s | %s | %s |\n" \
      "$mode" "$clients" "$a_tps" "$f_tps" "$ratio" "$a_p50" "$f_p50" "$a_p99" "$f_p99"
  done
done
fi

# on_every_node WORKLOAD NAME: 16 pgbench clients on each fleet node in WORKLOAD for the run's
# seconds, side by side; each node's output in $work/NAME<port>.out.
on_every_node() {
  local workload=$1 name=$2 clients=()
  rm -f "$work/$name"*.out
  for port in 6571 6572 6573; do
    (cd "$work" && PGOPTIONS="-c workload=$workload" pgbench -n -c 16 -j 4 -T "$seconds" \
      -f select1.sql -h 127.0.0.1 -p "$port" -U bench postgres >"$work/$name$port.out" 2>&1) &
    clients+=($!)
  done
  wait "${clients[@]}"
}

if section 2; then
echo
echo "etcd's traffic (messages received by its three members, per second)"
echo
before=$(etcd_messages)
sleep "$seconds"
idle=$(( ($(etcd_messages) - before) / seconds ))
before=$(etcd_messages)
on_every_node tight busy
busy=$(( ($(etcd_messages) - before) / seconds ))
busy_tps=$(awk '/^tps = / {s += $3} END {printf "%.0f", s}' "$work"/busy*.out)
echo "| fleet | etcd messages/s |"
echo "|---|---|"
echo "| idle (3 nodes) | $idle |"
echo "| busy (3 × 16 clients, limit 8 across the fleet, $busy_tps TPS in all) | $busy |"
fi

if section 3; then
echo
echo "a rate across the fleet: max_queries_per_second = 1000 (burst 100), 3 nodes × 16 clients, ${seconds} s"
echo
before=$(etcd_messages)
on_every_node rated rated
rated=$(( ($(etcd_messages) - before) / seconds ))
echo "| node | TPS |"
echo "|---|---|"
for port in 6571 6572 6573; do
  printf "| %s | %.0f |\n" "$port" "$(awk '/^tps = / {print $3}' "$work/rated$port.out")"
done
printf "| fleet | %.0f (rate 1000/s) |\n" "$(awk '/^tps = / {s += $3} END {print s}' "$work"/rated*.out)"
echo
echo "etcd messages/s meanwhile: $rated"
fi

if section 4; then
echo
echo "clusterAllReplicas('default', system.processes) on one node of three vs system.processes, 1 client, ${seconds} s"
echo
echo "| query | TPS | p50 ms | p99 ms |"
echo "|---|---|---|---|"
read -r l_tps l_p50 l_p99 < <(run 6571 simple 1 open local_view.sql)
read -r c_tps c_p50 c_p99 < <(run 6571 simple 1 open fleet_view.sql)
printf "| system.processes | %.0f | %s | %s |\n" "$l_tps" "$l_p50" "$l_p99"
printf "| clusterAllReplicas | %.0f | %s | %s |\n" "$c_tps" "$c_p50" "$c_p99"
fi
