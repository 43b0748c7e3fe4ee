#!/usr/bin/env bash
# Peak resident memory of all HiveFS services (mgmtd, metadata, storage, the
# mount) under the data-path loads of docs/performance.md, on a fresh
# `hivefs up` file system with the defaults:
#   fio sequential 1 MiB write then read (2 jobs, file per job, end_fsync),
#   fio 4 KiB random write then read (2 jobs, psync, 10 s each),
#   hivefs bench md through the mount (8 ranks x 2,000 empty files).
# After each load it prints every service's peak RSS (VmHWM) from
# `hivefs status --json` and their sum.
# Usage: bench/peak-rss.sh [TOTAL_SIZE=4g] [WORKDIR=/tmp/hivefs-rss]
# Uses target/release/hivefs (cargo build --release) unless HIVEFS is set.
set -euo pipefail
TOTAL=${1:-4g}; W=${2:-/tmp/hivefs-rss}
HIVEFS=${HIVEFS:-$(dirname "$0")/../target/release/hivefs}
command -v fio >/dev/null || { echo "fio is required (apt-get install fio)" >&2; exit 1; }
[ -x "$HIVEFS" ] || { echo "$HIVEFS not found: run cargo build --release or set HIVEFS" >&2; exit 1; }
per_job=$(( $(numfmt --from=iec "${TOTAL^^}") / 2 ))
D=$W/fs; M=$W/mnt
"$HIVEFS" down --force --dir "$D" >/dev/null 2>&1 || true
rm -rf "$W"; mkdir -p "$W"
trap '"$HIVEFS" down --force --dir "$D" >/dev/null 2>&1 || true; rm -rf "$W"' EXIT
"$HIVEFS" up --dir "$D" --mount "$M" >/dev/null
drop() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true; }
peaks() { # label
  "$HIVEFS" status --dir "$D" --json | python3 -c '
import json, sys
s = json.load(sys.stdin)
per = " ".join("%s %.0f" % (x["name"], x["peak_rss_kib"] / 1024) for x in s["services"] if x["peak_rss_kib"])
print("%-18s peak RSS MiB: %s; sum %.0f" % (sys.argv[1], per, s["total_peak_rss_kib"] / 1024))' "$1"
}
peaks "after start"
fio_run() { # name rw bs [extra...]
  local name=$1 rw=$2 bs=$3; shift 3
  fio --name="$name" --directory="$M" --rw="$rw" --bs="$bs" --size="$per_job" --numjobs=2 \
      --ioengine=psync --group_reporting --output-format=terse "$@" >/dev/null
}
fio_run seq write 1m --end_fsync=1; drop
fio_run seq read 1m; peaks "sequential 1 MiB"
fio_run seq randwrite 4k --time_based --runtime=10; drop
fio_run seq randread 4k --time_based --runtime=10; peaks "random 4 KiB"
rm -f "$M"/seq.*
"$HIVEFS" bench md "$M" --ranks 8 --files 2000 --no-progress >/dev/null; peaks "bench md"
