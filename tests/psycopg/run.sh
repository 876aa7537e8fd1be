#!/usr/bin/env bash
# psycopg's own test suite against PostgreSQL directly and through sluice in both pooling modes,
# side by side: prints the tests that pass directly but not through sluice, and fails if any of
# them is not one of transaction pooling's nature (nature.txt).
#
#   bash tests/psycopg/run.sh PSYCOPG_CHECKOUT [SLUICE_BINARY]
#
# PSYCOPG_CHECKOUT: a checkout of https://github.com/psycopg/psycopg at tag 3.3.4 (its tests/
# are not in the PyPI packages, and this repository does not copy them). SLUICE_BINARY defaults
# to target/debug/sluice. Needs the machine's PostgreSQL server binaries and python3; makes a
# venv with psycopg[binary]==3.3.4 under $WORK (default /var/tmp/sluice-psycopg). Runs all of
# tests/ but tests/pool/ and tests/crdb/, without the slow, flakey and timing marks. Takes a few
# minutes: not part of `cargo test` (CI cannot fetch psycopg's tests).
set -euo pipefail
src="$(cd "${1:?a psycopg checkout at tag 3.3.4}" && pwd)"
here="$(cd "$(dirname "$0")" && pwd)"
sluice="${2:-$here/../../target/debug/sluice}"
work="${WORK:-/var/tmp/sluice-psycopg}"
bin="$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)"
mkdir -p "$work"
if [ ! -x "$work/venv/bin/python" ]; then
  python3 -m venv "$work/venv"
  "$work/venv/bin/pip" install -q "psycopg[binary]==3.3.4" "anyio>=4.0" "pytest>=6.2.5" \
    pytest-randomly "pproxy>=2.7"
fi
as_pg() { if [ "$(id -u)" = 0 ]; then su postgres -s /bin/sh -c "$1"; else sh -c "$1"; fi; }
rm -rf "$work/pg" "$work/s1" "$work/s2" "$work"/cache-*
mkdir -p "$work/pg"
[ "$(id -u)" = 0 ] && chown postgres "$work/pg"
port=$((20000 + RANDOM % 20000))
as_pg "$bin/initdb -D '$work/pg/data' -A trust -U postgres >/dev/null"
as_pg "$bin/pg_ctl -D '$work/pg/data' -l '$work/pg/log' -o '-p $port -k $work/pg -c listen_addresses=127.0.0.1 -c max_connections=200' -w start >/dev/null"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  as_pg "$bin/pg_ctl -D '$work/pg/data' -m immediate stop >/dev/null" || true
}
trap cleanup EXIT
for mode in session transaction; do
  [ "$mode" = session ] && p=$((port + 1)) || p=$((port + 2))
  mkdir -p "$work/$mode"
  cat > "$work/$mode/sluice.toml" <<TOML
[upstream]
url = "postgres://postgres@127.0.0.1:$port/postgres?sslmode=disable"
pool_size = 40
pool_mode = "$mode"
TOML
  "$sluice" serve --config "$work/$mode/sluice.toml" --listen "127.0.0.1:$p" \
    --data-dir "$work/$mode/data" > "$work/$mode/log" 2>&1 &
  pids+=($!)
done
sleep 2
suite() { # NAME PORT
  (cd "$src" && PSYCOPG_TEST_DSN="host=127.0.0.1 port=$2 user=postgres dbname=postgres" \
    timeout 1800 "$work/venv/bin/python" -m pytest tests --ignore=tests/pool --ignore=tests/crdb \
      -m "not slow and not flakey and not timing" -p no:randomly -o "cache_dir=$work/cache-$1" \
      -q --junitxml="$work/$1.xml" > "$work/$1.log" 2>&1) || true
  tail -1 "$work/$1.log"
}
echo "== directly";              suite direct "$port"
echo "== session pooling";       suite session $((port + 1))
echo "== transaction pooling";   suite transaction $((port + 2))
status=0
echo "== session pooling, lost:"
"$work/venv/bin/python" "$here/compare.py" "$work/direct.xml" "$work/session.xml" || status=1
echo "== transaction pooling, lost (beyond tests/psycopg/nature.txt):"
"$work/venv/bin/python" "$here/compare.py" "$work/direct.xml" "$work/transaction.xml" \
  "$here/nature.txt" || status=1
exit $status
