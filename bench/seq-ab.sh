#!/usr/bin/env bash
# A/B of hivefs builds on sequential 1 MiB I/O (fio: 2 jobs, file per job, psync,
# end_fsync, caches dropped between write and read), with the plain disk and a bindfs
# passthrough of it measured in the same run, each build on a fresh `hivefs up`
# (defaults), ROUNDS rounds. Needs fio and bindfs (apt-get install fio bindfs); root.
# Usage: bench/seq-ab.sh WORKDIR HIVEFS_BINARY...   (env: SIZE=2g per job, ROUNDS=2)
set -euo pipefail
W=$1; shift
(($#)) || { echo "usage: $0 WORKDIR HIVEFS_BINARY..." >&2; exit 2; }
SIZE=${SIZE:-2g}; ROUNDS=${ROUNDS:-2}
command -v fio >/dev/null || { echo "fio is required (apt-get install fio)" >&2; exit 1; }
drop() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true; }
bw() { # dir rw -> MiB/s
  fio --name=seq --directory="$1" --rw="$2" --bs=1m --size="$SIZE" --numjobs=2 --ioengine=psync \
      --end_fsync=1 --group_reporting --output-format=json 2>/dev/null |
    python3 -c "import json,sys; j=json.load(sys.stdin)['jobs'][0]; print(round(j['$2']['bw']/1024))"
}
run() { # dir label
  local w r; mkdir -p "$1/seq"
  w=$(bw "$1/seq" write); drop; r=$(bw "$1/seq" read)
  rm -rf "$1/seq"; drop
  echo "$2 write_mib_s $w read_mib_s $r"
}
mkdir -p "$W/plain" "$W/bsrc" "$W/bmnt" "$W/mnt"
run "$W/plain" plain
bindfs --multithreaded -o big_writes,max_write=131072 "$W/bsrc" "$W/bmnt"
trap 'fusermount3 -u "$W/bmnt" 2>/dev/null || true' EXIT
run "$W/bmnt" bindfs
fusermount3 -u "$W/bmnt"
for round in $(seq "$ROUNDS"); do
  for b in "$@"; do
    rm -rf "$W/fs"; mkdir -p "$W/fs"
    "$b" up --dir "$W/fs" --mount "$W/mnt" >/dev/null
    run "$W/mnt" "$b round $round"
    "$b" down --dir "$W/fs" >/dev/null
  done
done
