# Sourced by the end-to-end bench scripts: a scratch directory ($work, removed on exit with
# every background job), `start_sluice BIN PORT [SERVE ARGS…]` (a server with its data dir in
# $work, waited for until it listens; its pid in $pid), and `psql` to it as user bench.
work="$(mktemp -d)"
cleanup() {
  jobs -p | xargs -r kill 2>/dev/null || true
  [ -n "${pid:-}" ] && kill "$pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
start_sluice() {
  local bin="$1"
  port="$2"
  shift 2
  "$bin" serve --listen "127.0.0.1:$port" --data-dir "$work/data" "$@" >/dev/null 2>"$work/log" &
  pid=$!
  for _ in $(seq 100); do grep -q "listening on" "$work/log" 2>/dev/null && break; sleep 0.1; done
}
psql() { command psql -X -q -h 127.0.0.1 -p "$port" -U bench -d bench "$@"; }
