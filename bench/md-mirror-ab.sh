#!/usr/bin/env bash
# Metadata operations on mirrored against unmirrored namespaces in the same run: a
# fresh `hivefs up` with 2 metadata servers; `hivefs bench md` (8 ranks x 1000 empty
# files, a directory per rank) through the mount and the native client, ROUNDS rounds
# unmirrored; then both namespaces mirrored (`mirror create --type meta --auto`, a
# ring: each node also keeps the other's copy) and the same ROUNDS rounds again.
# Mirroring cannot be undone, so the rounds are not interleaved. Root (FUSE).
# Usage: bench/md-mirror-ab.sh WORKDIR HIVEFS_BINARY     (env: ROUNDS=3)
set -euo pipefail
W=$1 H=$2 ROUNDS=${ROUNDS:-3}
D=$W/fs M=$W/mnt
"$H" down --dir "$D" --force >/dev/null 2>&1 || true
rm -rf "$D"; mkdir -p "$D"
"$H" up --dir "$D" --mount "$M" --meta 2 --storage 1 >/dev/null
trap '"$H" down --dir "$D" >/dev/null' EXIT
run() {
  "$H" bench md "$M" "$@" --ranks 8 --files 1000 --json --no-progress 2>/dev/null | python3 -c '
import json, sys
print(" ".join("%s=%.0f" % (p["phase"], p["ops_per_s"]) for p in json.load(sys.stdin)["run"]["phases"]))'
}
rounds() {
  for round in $(seq "$ROUNDS"); do
    echo "$1 mount  round $round: $(run)"
    echo "$1 native round $round: $(run --native)"
  done
}
rounds unmirrored
"$H" mirror create --type meta --auto --force --mount "$M" >/dev/null
until [ "$("$H" mirror list --type meta --mount "$M" | grep -c 'good.*good')" = 2 ]; do sleep 0.3; done
rounds mirrored
