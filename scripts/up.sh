#!/usr/bin/env bash
# One command from a fresh machine to a mounted HiveFS: installs missing
# packages, builds, starts a file system with the defaults (1 metadata server,
# 2 storage servers x 4 targets, 512 KiB chunks, balanced striping over all
# targets), and shows it working.
#   DIR (default /tmp/hivefs) holds data, logs and pids; MNT (default /mnt/hivefs) is the mount point.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${DIR:-/tmp/hivefs}
MNT=${MNT:-/mnt/hivefs}
scripts/install-deps.sh
cargo build --release --bin hivefs
HIVEFS=target/release/hivefs
$HIVEFS up --dir "$DIR" --mount "$MNT"
echo
echo "== writing a 64 MiB file and reading it back"
head -c 64M /dev/urandom > "$DIR/sample"
cp "$DIR/sample" "$MNT/sample"
cmp "$DIR/sample" "$MNT/sample" && echo "read back identical: $MNT/sample"
rm -f "$DIR/sample"
echo
$HIVEFS entry info "$MNT/sample"
echo
$HIVEFS targets --mount "$MNT"
echo
echo "HiveFS is mounted on $MNT. Stop it with: $HIVEFS down --dir $DIR"
