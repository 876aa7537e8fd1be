#!/usr/bin/env bash
# A 200 MB CSV read by two workloads at once, one under max_bytes_per_second = '20Mi', one
# unthrottled (issue 11's must-show), then each alone for the baseline.
#
#   bench/disk_throttle.sh SLUICE_BIN [MEGABYTES]     (default 200)
#
# Prints the wall time of `SELECT count(*)` over the file in each workload.
set -euo pipefail
bin="$1"
megabytes="${2:-200}"
. "$(dirname "$0")/lib.sh"
mkdir -p "$work/disk"
python3 - "$work/disk/events.csv" "$megabytes" <<'PY'
import sys
path, mb = sys.argv[1], int(sys.argv[2])
target = mb * 1000 * 1000
with open(path, "w") as f:
    f.write("a,b\n")
    i, written = 0, 4
    chunk = []
    while written < target:
        line = f"{i},row number {i} of the throttled file\n"
        chunk.append(line)
        written += len(line)
        i += 1
        if len(chunk) == 100000:
            f.write("".join(chunk))
            chunk = []
    f.write("".join(chunk))
PY
start_sluice "$bin" 6552 --disk "data=$work/disk"
psql -c "CREATE RESOURCE disk_io (READ DISK data, WRITE DISK data)" \
     -c "CREATE WORKLOAD all" \
     -c "CREATE WORKLOAD reports IN all SETTINGS max_bytes_per_second = '20Mi'" \
     -c "CREATE WORKLOAD etl IN all" \
     -c "CREATE EXTERNAL TABLE events (a BIGINT, b VARCHAR) STORED AS CSV LOCATION '$work/disk/events.csv' OPTIONS ('format.has_header' 'true')"
timed() {
  local start end
  start=$(date +%s.%N)
  psql -At -c "SELECT count(*) FROM events SETTINGS workload = '$1'" >/dev/null
  end=$(date +%s.%N)
  echo "$1 $2: $(echo "$end - $start" | bc) s"
}
size=$(stat -c %s "$work/disk/events.csv")
echo "file: $size bytes"
timed etl alone
timed reports alone
timed reports "beside etl" &
throttled=$!
sleep 1
timed etl "beside reports"
wait "$throttled"
psql -At -c "SELECT path || ' dequeued_cost=' || dequeued_cost || ' throttling_us=' || coalesce(throttling_us, 0) FROM system.scheduler WHERE resource = 'disk_io' AND type = 'bandwidth_limit'"
