#!/usr/bin/env bash
# Metadata journal A/B: bench md through the mount and with the native client, on a fresh
# `hivefs up` per build and round (builds alternated), and through a bindfs passthrough of a
# directory on the same disk in the same round. Per phase: ops/s, the metadata service's CPU
# per operation (µs), the mount's, the storage services' (summed), and metadata requests per
# operation.
# FRESH=1: every run (each build, and bindfs) on a new ext4 in a file on the same disk
# (loop device), so that no run pays for the inodes an earlier one deleted: ext4 skips
# inodes freed in the last seconds when it allocates (`recently_deleted`), and after a
# few runs on one file system that scan is most of the storage services' CPU.
# Needs bindfs; root.
# Usage: bench/md-journal-ab.sh WORKDIR OLD_BINARY NEW_BINARY
#        (env: ROUNDS=2 RANKS=8 FILES=2000 SIZE=0 SHARED=0 META=1 FRESH=0)
set -euo pipefail
W=$1; OLD=$2; NEW=$3
ROUNDS=${ROUNDS:-2}; RANKS=${RANKS:-8}; FILES=${FILES:-2000}; SIZE=${SIZE:-0}; META=${META:-1}
extra=(); [ "${SHARED:-0}" = 1 ] && extra+=(--shared-dir)
. "$(dirname "$0")/fresh-disk.sh"
bindfs_up() {
  fresh
  mkdir -p "$D/bsrc"
  bindfs --multithreaded -o big_writes,max_write=131072 "$D/bsrc" "$W/bmnt"
}
cleanup() {
  fusermount3 -u "$W/bmnt" 2>/dev/null || true
  for b in "$OLD" "$NEW"; do "$b" down --dir "$D/fs" >/dev/null 2>&1 || true; done
  if mountpoint -q "$W/disk"; then umount "$W/disk"; fi
  rm -f "$W/disk.img"
}
trap cleanup EXIT
md() { "$1" bench md "$2" --ranks "$RANKS" --files "$FILES" --file-size "$SIZE" --no-progress --json "${@:3}" "${extra[@]}"; }
show() {
  python3 -c '
import json, sys
r = json.load(sys.stdin)["run"]
out = []
for p in r["phases"]:
    cpu = p.get("service_cpu_us_per_op", {})
    meta = sum(v for k, v in cpu.items() if k.startswith("meta"))
    storage = sum(v for k, v in cpu.items() if k.startswith("storage"))
    req = sum(p.get("meta_requests", {}).values()) / max(p["ops"], 1)
    s = "%s %.0f/s" % (p["phase"], p["ops_per_s"])
    if cpu:
        s += " meta %.0fus mount %.0fus storage %.0fus req/op %.2f" % (meta, cpu.get("mount", 0), storage, req)
    out.append(s)
print(" | ".join(out))'
}
for round in $(seq "$ROUNDS"); do
  for b in "$OLD" "$NEW"; do
    for how in mount native; do
      # With FRESH=1 the native run gets a file system of its own too.
      if [ "$how" = mount ] || [ "${FRESH:-0}" = 1 ]; then
        fresh
        rm -rf "$D/fs"
        "$b" up --dir "$D/fs" --mount "$W/mnt" --meta "$META" >/dev/null
      fi
      args=(); [ "$how" = native ] && args=(--native)
      echo "round $round $(basename "$b") $how: $(md "$b" "$W/mnt" "${args[@]}" | show)"
      if [ "$how" = native ] || [ "${FRESH:-0}" = 1 ]; then
        "$b" down --dir "$D/fs" >/dev/null
      fi
    done
  done
  bindfs_up
  echo "round $round bindfs: $(md "$NEW" "$W/bmnt" | show)"
  fusermount3 -u "$W/bmnt"
done
