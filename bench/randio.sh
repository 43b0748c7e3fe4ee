#!/usr/bin/env bash
# 4 KiB random write then read IOPS (fio: 2 jobs, file per job, psync, time-based),
# for each directory given, in one run, so the figures can be read as ratios.
# Usage: bench/randio.sh [SECONDS=10] [SIZE_PER_JOB=256m] DIR...
# Prints "DIR write_iops read_iops" per directory. Caches are dropped between phases.
set -euo pipefail
SECS=10; SIZE=256m
[[ ${1:-} =~ ^[0-9]+$ ]] && { SECS=$1; shift; }
[[ ${1:-} =~ ^[0-9]+[kmgKMG]$ ]] && { SIZE=$1; shift; }
(($#)) || { echo "usage: $0 [SECONDS] [SIZE_PER_JOB] DIR..." >&2; exit 2; }
command -v fio >/dev/null || { echo "fio is required (apt-get install fio)" >&2; exit 1; }
drop() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true; }
iops() { # dir rw -> IOPS
  fio --name=rand --directory="$1" --rw="$2" --bs=4k --size="$SIZE" --numjobs=2 \
      --ioengine=psync --time_based --runtime="$SECS" --group_reporting \
      --output-format=json 2>/dev/null |
    python3 -c "import json,sys; j=json.load(sys.stdin)['jobs'][0]; print(round(j['$3']['iops']))"
}
for d in "$@"; do
  mkdir -p "$d/randio"
  # Lay the files out first, so the write phase measures overwrites, not allocation.
  fio --name=rand --directory="$d/randio" --rw=write --bs=1m --size="$SIZE" --numjobs=2 \
      --ioengine=psync --end_fsync=1 >/dev/null 2>&1
  drop
  w=$(iops "$d/randio" randwrite write); drop
  r=$(iops "$d/randio" randread read)
  rm -rf "$d/randio"; drop
  echo "$d $w $r"
done
