#!/usr/bin/env bash
# Small interleaved writes over TCP (IOR-hard-like: `bench io` N-1, RANKS ranks, transfer
# = block = 47,008 bytes, SEGMENTS segments, fsync): a `--no-short-circuit` mount in cache
# mode native against one in cache mode buffered (write-back), and a bindfs passthrough
# of a directory on the same disk, in the same round, ROUNDS rounds, on a fresh
# `hivefs up` (defaults) per round. Prints write and read MiB/s per case. Needs bindfs; root.
# Usage: bench/smallwrite-ab.sh WORKDIR HIVEFS_BINARY   (env: RANKS=4 SEGMENTS=1000 ROUNDS=3;
# T=1048576 for large transfers)
set -euo pipefail
W=$1; B=$2
RANKS=${RANKS:-4}; SEGMENTS=${SEGMENTS:-1000}; ROUNDS=${ROUNDS:-3}; T=${T:-47008}
mkdir -p "$W/bsrc" "$W/bmnt" "$W/mnt" "$W/native" "$W/buffered"
cleanup() {
  for m in "$W/bmnt" "$W/native" "$W/buffered"; do fusermount3 -u "$m" 2>/dev/null || true; done
  "$B" down --dir "$W/fs" >/dev/null 2>&1 || true
}
trap cleanup EXIT
io() { # dir label
  "$B" bench io "$1" --ranks "$RANKS" --transfer-size $T --block-size $T --segments "$SEGMENTS" \
      --fsync --drop-caches --json --no-progress |
    python3 -c "import json,sys; j=json.load(sys.stdin); \
print('$2', 'write_mib_s', round(j['write']['aggregate_mib_s']), 'read_mib_s', round(j['read']['aggregate_mib_s']))"
}
mount_extra() { # mountpoint cache-mode
  "$B" mount --mgmtd "$MGMTD" --secret-file "$W/fs/secret" --no-short-circuit --cache-mode "$2" "$1" \
      >"$W/mount-$2.log" 2>&1 &
  for _ in $(seq 100); do mountpoint -q "$1" && return; sleep 0.1; done
  echo "mount on $1 did not come up" >&2; exit 1
}
for round in $(seq "$ROUNDS"); do
  rm -rf "$W/fs"; mkdir -p "$W/fs"
  "$B" up --dir "$W/fs" --mount "$W/mnt" >/dev/null
  MGMTD=$(tr '\0' ' ' <"/proc/$(cat "$W/fs/client/mount.pid")/cmdline" | sed -n 's/.*--mgmtd \([^ ]*\).*/\1/p')
  mount_extra "$W/native" native
  mount_extra "$W/buffered" buffered
  bindfs --multithreaded -o big_writes,max_write=131072 "$W/bsrc" "$W/bmnt"
  io "$W/bmnt" "round $round bindfs"
  io "$W/native" "round $round native-tcp"
  io "$W/buffered" "round $round buffered-tcp"
  cleanup
done
