#!/usr/bin/env bash
# cp of one large file: server-side (coreutils cp uses copy_file_range, which HiveFS
# runs on the storage servers), client-side (dd bs=4M through the same mount), and the
# local disk's own cp, alternated in ROUNDS rounds with caches dropped before each.
# Usage: bench/copy-compare.sh MNT PLAIN_DIR   (env: SIZE=4G, ROUNDS=3); root.
set -euo pipefail
MNT=$1; PLAIN=$2
SIZE=${SIZE:-4G}; ROUNDS=${ROUNDS:-3}
secs() { local s e; s=$(date +%s.%N); "$@"; sync; e=$(date +%s.%N); echo "$e - $s" | bc; }
head -c "$SIZE" /dev/urandom > "$MNT/copy-src"
cp "$MNT/copy-src" "$PLAIN/copy-src"
sync
for r in $(seq "$ROUNDS"); do
  rm -f "$MNT/copy-cp" "$MNT/copy-dd" "$PLAIN/copy-cp"
  sync; echo 3 > /proc/sys/vm/drop_caches
  a=$(secs cp "$MNT/copy-src" "$MNT/copy-cp")
  b=$(secs dd if="$MNT/copy-src" of="$MNT/copy-dd" bs=4M status=none)
  c=$(secs cp "$PLAIN/copy-src" "$PLAIN/copy-cp")
  echo "round $r ($SIZE): server-side cp ${a}s, client-side dd ${b}s, local-disk cp ${c}s"
done
cmp "$MNT/copy-src" "$MNT/copy-cp"
rm -f "$MNT"/copy-src "$MNT"/copy-cp "$MNT"/copy-dd "$PLAIN"/copy-src "$PLAIN"/copy-cp
