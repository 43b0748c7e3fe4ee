#!/usr/bin/env bash
# Metadata scaling: `hivefs bench md` with 1, 2 and 4 metadata servers, through
# the mount and through the native client (no FUSE), a directory per rank and
# one shared directory, with the same workload on a plain local directory in
# the same run (the baseline of the ratios). The bench reports ops/s per
# phase, CPU time per operation of every service and the requests each
# metadata node received.
# Usage: bench/md-scaling.sh [RANKS=8] [FILES_PER_RANK=1000] [OUT=md-scaling.txt]
# Needs root (FUSE) and a release build (target/release/hivefs).
set -euo pipefail
cd "$(dirname "$0")/.."
RANKS=${1:-8}; FILES=${2:-1000}; OUT=${3:-md-scaling.txt}
HIVEFS=${HIVEFS:-target/release/hivefs}
[ -x "$HIVEFS" ] || { echo "$HIVEFS not found: cargo build --release -p hivefs" >&2; exit 1; }
work=$(mktemp -d /tmp/hivefs-md-scaling.XXXXXX)
cleanup() { "$HIVEFS" down --dir "$work/fs" --force >/dev/null 2>&1 || true; rm -rf "$work"; }
trap cleanup EXIT
mkdir -p "$work/plain"
: > "$OUT"
for meta in 1 2 4; do
  "$HIVEFS" down --dir "$work/fs" --force >/dev/null 2>&1 || true
  rm -rf "$work/fs"
  "$HIVEFS" up --dir "$work/fs" --mount "$work/mnt" --meta "$meta" --storage 1 --targets-per-storage 2 >/dev/null
  for shared in "" --shared-dir; do
    for native in "" --native; do
      { echo "== $meta metadata server(s), ${native:-mount} ${shared:-a directory per rank}"
        "$HIVEFS" bench md "$work/mnt" $native $shared --ranks "$RANKS" --files "$FILES" \
          --compare-dir "$work/plain" --no-progress; } 2>&1 | tee -a "$OUT"
    done
  done
done
echo "results: $OUT" >&2
