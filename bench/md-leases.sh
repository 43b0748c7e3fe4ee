#!/usr/bin/env bash
# bench md through the mount with attribute leases on (metadata default) and off
# (attr_lease_ms = 0), each on a fresh `hivefs up`, and on a bindfs passthrough of a
# directory on the same disk in the same round. Needs bindfs (apt-get install bindfs); root.
# Usage: bench/md-leases.sh WORKDIR [HIVEFS_BINARY]   (env: ROUNDS=3 RANKS=8 FILES=1000)
set -euo pipefail
W=$1; B=${2:-hivefs}
ROUNDS=${ROUNDS:-3}; RANKS=${RANKS:-8}; FILES=${FILES:-1000}
mkdir -p "$W/bsrc" "$W/bmnt" "$W/mnt"
bindfs --multithreaded -o big_writes,max_write=131072 "$W/bsrc" "$W/bmnt"
trap 'fusermount3 -u "$W/bmnt" 2>/dev/null || true; "$B" down --dir "$W/fs" >/dev/null 2>&1 || true' EXIT
md() { "$B" bench md "$1" --ranks "$RANKS" --files "$FILES" --no-progress --json; }
ops() { python3 -c 'import json,sys; r=json.load(sys.stdin)["run"]; print(" ".join("%s %.0f" % (p["phase"], p["ops_per_s"]) for p in r["phases"]))'; }
for round in $(seq "$ROUNDS"); do
  for lease in default 0; do
    rm -rf "$W/fs"; mkdir -p "$W/fs/meta1"
    [ "$lease" = default ] || echo "attr_lease_ms = $lease" > "$W/fs/meta1/meta.toml"
    "$B" up --dir "$W/fs" --mount "$W/mnt" >/dev/null
    echo "round $round leases $lease: $(md "$W/mnt" | ops)"
    "$B" down --dir "$W/fs" >/dev/null
  done
  echo "round $round bindfs: $(md "$W/bmnt" | ops)"
done
