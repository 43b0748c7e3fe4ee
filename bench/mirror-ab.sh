#!/usr/bin/env bash
# Mirrored against unmirrored sequential I/O in the same run: a fresh `hivefs up` with
# 2 storage servers x 2 targets, storage buddy groups over both servers, one plain and
# one mirrored directory; `hivefs bench io` (4 ranks x 64 MiB, N-1, fsync) through the
# mount, the native client, and the native client over TCP only (--no-short-circuit:
# the path mirrored files always take), ROUNDS rounds alternating. Root (FUSE).
# Usage: bench/mirror-ab.sh WORKDIR HIVEFS_BINARY     (env: ROUNDS=3)
set -euo pipefail
W=$1 H=$2 ROUNDS=${ROUNDS:-3}
D=$W/fs M=$W/mnt
"$H" down --dir "$D" --force >/dev/null 2>&1 || true
rm -rf "$D"; mkdir -p "$D"
"$H" up --dir "$D" --mount "$M" --storage 2 --targets-per-storage 2 >/dev/null
trap '"$H" down --dir "$D" >/dev/null' EXIT
"$H" mirror create --type storage --auto --mount "$M" >/dev/null
mkdir "$M/plain" "$M/mirrored"
"$H" pattern set "$M/mirrored" --mirror >/dev/null
echo "round dir api write_MiB/s read_MiB/s"
for round in $(seq "$ROUNDS"); do
  for kind in plain mirrored; do
    for api in mount native native-tcp; do
      case $api in
        mount) args=("$M/$kind");;
        native) args=(--native --mount "$M" "/$kind");;
        native-tcp) args=(--native --no-short-circuit --mount "$M" "/$kind");;
      esac
      "$H" bench io "${args[@]}" --ranks 4 --block-size 64m --fsync --json --no-progress 2>/dev/null |
        python3 -c "import json,sys; d=json.load(sys.stdin); print($round, '$kind', '$api', round(d['write']['aggregate_mib_s']), round(d['read']['aggregate_mib_s']))"
    done
  done
done
