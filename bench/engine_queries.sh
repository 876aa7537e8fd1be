#!/usr/bin/env bash
# Embedded-engine query times of two sluice binaries, side by side in one run: a scan with
# aggregates, a GROUP BY, a join and a sort, over generated rows (no files), each run ROUNDS
# times alternating between the binaries; prints each query's median seconds per binary and
# the ratio (new / baseline; above 1 is slower). For build settings that trade compile time
# against code quality (BENCHMARKS.md, "A newcomer's first build").
#
#   bench/engine_queries.sh BASELINE_BIN NEW_BIN [ROUNDS]      (default 5)
set -euo pipefail
cd "$(dirname "$0")/.."
baseline="$1"
new="$2"
rounds="${3:-5}"

work="$(mktemp -d)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

start() {
  local bin=$1 port=$2
  "$bin" serve --listen "127.0.0.1:$port" --data-dir "$work/$port" >/dev/null 2>"$work/$port.log" &
  pids+=($!)
  for _ in $(seq 100); do grep -q "listening on" "$work/$port.log" 2>/dev/null && break; sleep 0.1; done
}
start "$baseline" 6561
start "$new" 6562

queries=(
  "SELECT count(*), sum(v), avg(v % 7), max(v * 2) FROM generate_series(1, 200000000) t(v)"
  "SELECT v % 100000 AS k, count(*), sum(v) FROM generate_series(1, 50000000) t(v) GROUP BY k ORDER BY k LIMIT 3"
  "SELECT count(*) FROM generate_series(1, 10000000) a(x) JOIN generate_series(1, 10000000) b(y) ON a.x = b.y * 2"
  "SELECT v FROM (SELECT (v * 7919) % 1000003 AS v FROM generate_series(1, 30000000) t(v)) ORDER BY v DESC LIMIT 5"
)

# seconds PORT QUERY: the query's wall time through psql, in seconds.
seconds() {
  local start end
  start=$(date +%s.%N)
  psql -X -q -h 127.0.0.1 -p "$1" -U bench -d bench -c "$2" >/dev/null
  end=$(date +%s.%N)
  echo "$end - $start" | bc
}
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

printf '| query | baseline s | new s | new / baseline |\n|---|---|---|---|\n'
for i in "${!queries[@]}"; do
  q="${queries[$i]}"
  seconds 6561 "$q" >/dev/null # warm both
  seconds 6562 "$q" >/dev/null
  : >"$work/a"
  : >"$work/b"
  for _ in $(seq "$rounds"); do
    seconds 6561 "$q" >>"$work/a"
    seconds 6562 "$q" >>"$work/b"
  done
  a=$(median <"$work/a")
  b=$(median <"$work/b")
  printf '| %s | %.3f | %.3f | %.2f |\n' "Q$((i + 1))" "$a" "$b" "$(echo "$b / $a" | bc -l)"
done
for i in "${!queries[@]}"; do echo "Q$((i + 1)): ${queries[$i]}"; done
