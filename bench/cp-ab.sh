#!/usr/bin/env bash
# `hivefs cp` against `cp -a` and `rsync -a` in the same run, on a fresh `hivefs up`
# (the defaults): one large file (SIZE) and FILES small files of 4 KiB in DIRS
# directories, copied INTO the mount from the local disk and OUT of it to the local
# disk. Before each copy the destination is removed and the caches are dropped (`sync`,
# drop_caches); the time is the command's alone. Ratios are cp -a's time over the
# tool's (2.00x: twice as fast as cp -a). WORKERS is a list: one `hivefs cp` run per
# worker count. rsync -a keeps less than cp -a (no hard links, no xattrs). Root (FUSE).
# Usage: bench/cp-ab.sh WORKDIR HIVEFS_BINARY
#   (env: SIZE=3G FILES=100000 DIRS=300 ROUNDS=1 WORKERS="16" CASES="large small")
set -euo pipefail
W=$1 H=$(realpath "$2")
SIZE=${SIZE:-3G} FILES=${FILES:-100000} DIRS=${DIRS:-300} ROUNDS=${ROUNDS:-1}
WORKERS=${WORKERS:-16} CASES=${CASES:-large small}
command -v rsync >/dev/null || apt-get install -y rsync >/dev/null
D=$W/fs M=$W/mnt L=$W/local
"$H" down --dir "$D" --force >/dev/null 2>&1 || true
rm -rf "$D" "$L"; mkdir -p "$D" "$L/src/large" "$L/src/small"
"$H" up --dir "$D" --mount "$M" >/dev/null
trap '"$H" down --dir "$D" >/dev/null' EXIT

head -c "$SIZE" /dev/urandom > "$L/src/large/file"
python3 - "$L/src/small" "$FILES" "$DIRS" <<'EOF'
import os, sys
root, files, dirs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
block = os.urandom(1 << 20)
for d in range(dirs):
    os.mkdir(f"{root}/d{d}")
for i in range(files):
    with open(f"{root}/d{i % dirs}/f{i}", "wb") as f:
        f.write(block[(i * 4099) % ((1 << 20) - 4096):][:4096])
EOF

# Seconds of "$@" from cold caches.
secs() {
  sync; echo 3 > /proc/sys/vm/drop_caches
  local s e; s=$(date +%s.%N); "$@"; e=$(date +%s.%N)
  echo "$e - $s" | bc
}
# Copies $1 (a directory) into the empty directory $2 with each tool.
compare() {
  local what=$1 from=$2 to=$3 base t line
  rm -rf "$to"; mkdir -p "$to"
  base=$(secs cp -a "$from" "$to/")
  line=$(printf '%-10s cp -a %7.2f s' "$what" "$base")
  rm -rf "$to"; mkdir -p "$to"
  t=$(secs rsync -a "$from" "$to/")
  line+=$(printf ', rsync -a %7.2f s (%.2fx)' "$t" "$(echo "$base / $t" | bc -l)")
  for w in $WORKERS; do
    rm -rf "$to"; mkdir -p "$to"
    t=$(secs "$H" cp --progress never --workers "$w" "$from" "$to/")
    line+=$(printf ', hivefs cp -w %s %7.2f s (%.2fx)' "$w" "$t" "$(echo "$base / $t" | bc -l)")
  done
  # The last copy must be complete.
  [ "$(find "$from" | wc -l)" = "$(find "$to" -mindepth 1 | wc -l)" ] || { echo "$what: incomplete copy" >&2; exit 1; }
  echo "$line"
}
for r in $(seq "$ROUNDS"); do
  echo "round $r: $(nproc) cores, SIZE=$SIZE, FILES=$FILES x 4 KiB in $DIRS dirs"
  for c in $CASES; do
    # Into the mount from the local disk, then out of a copy made by cp -a.
    compare "$c in" "$L/src/$c" "$M/in"
    rm -rf "$M/in"; mkdir -p "$M/src"; cp -a "$L/src/$c" "$M/src/"
    compare "$c out" "$M/src/$c" "$L/out"
    rm -rf "$M/src" "$L/out"
  done
done
rm -rf "$L"
