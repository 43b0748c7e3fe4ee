#!/usr/bin/env bash
# A/B of hivefs builds on 4 KiB random I/O (bench/randio.sh), with the plain disk and a
# bindfs passthrough of it measured in the same run, each build on a fresh `hivefs up`
# (defaults), ROUNDS rounds. Needs fio and bindfs (apt-get install fio bindfs); root.
# Usage: bench/randio-ab.sh WORKDIR HIVEFS_BINARY...   (env: SECS=8 SIZE=128m ROUNDS=2)
set -euo pipefail
W=$1; shift
(($#)) || { echo "usage: $0 WORKDIR HIVEFS_BINARY..." >&2; exit 2; }
R=$(dirname "$0")/randio.sh
SECS=${SECS:-8}; SIZE=${SIZE:-128m}; ROUNDS=${ROUNDS:-2}
mkdir -p "$W/plain" "$W/bsrc" "$W/bmnt" "$W/mnt"
bindfs --multithreaded -o big_writes,max_write=131072 "$W/bsrc" "$W/bmnt"
trap 'fusermount3 -u "$W/bmnt" 2>/dev/null || true' EXIT
echo "# dir write_iops read_iops"
"$R" "$SECS" "$SIZE" "$W/plain" "$W/bmnt"
fusermount3 -u "$W/bmnt"
for round in $(seq "$ROUNDS"); do
  for b in "$@"; do
    rm -rf "$W/fs"; mkdir -p "$W/fs"
    "$b" up --dir "$W/fs" --mount "$W/mnt" >/dev/null
    echo -n "$b round $round: "; "$R" "$SECS" "$SIZE" "$W/mnt"
    "$b" down --dir "$W/fs" >/dev/null
  done
done
