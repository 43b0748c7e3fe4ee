#!/usr/bin/env bash
# FUSE transport A/B: the same build through /dev/fuse and through FUSE over io_uring,
# alternated per round on a fresh `hivefs up` each, with a bindfs passthrough of the same
# disk in the same round. Per transport: bench md (creates, stats, reads, removes: ops/s,
# metadata and mount CPU per operation) and bench io with 4 KiB transfers (a file per
# rank, through the short-circuit path of the mount `hivefs up` makes), and the mount's
# context switches per metadata operation (its threads' wake-ups).
# The transport is chosen by the kernel's offer: the fuse module's enable_uring parameter
# is set to N for /dev/fuse and Y for io_uring before each mount (and restored at the end).
# FRESH=1: each run on a new ext4 in a file on the same disk (see md-journal-ab.sh).
# Needs bindfs; root; Linux 6.14+ with CONFIG_FUSE_IO_URING.
# Usage: bench/fuse-transport-ab.sh WORKDIR BINARY
#        (env: ROUNDS=2 RANKS=8 FILES=2000 SIZE=0 IO_RANKS=4 FRESH=0)
set -euo pipefail
W=$1; B=$2
ROUNDS=${ROUNDS:-2}; RANKS=${RANKS:-8}; FILES=${FILES:-2000}; SIZE=${SIZE:-0}; IO_RANKS=${IO_RANKS:-4}
P=/sys/module/fuse/parameters/enable_uring
[ -w "$P" ] || { echo "no $P (FUSE over io_uring needs Linux 6.14+ and root)" >&2; exit 1; }
was=$(cat "$P")
. "$(dirname "$0")/fresh-disk.sh"
cleanup() {
  echo "$was" > "$P"
  fusermount3 -u "$W/bmnt" 2>/dev/null || true
  "$B" down --dir "$D/fs" >/dev/null 2>&1 || true
  if mountpoint -q "$W/disk"; then umount "$W/disk"; fi
  rm -f "$W/disk.img"
}
trap cleanup EXIT
md() { "$B" bench md "$1" --ranks "$RANKS" --files "$FILES" --file-size "$SIZE" --no-progress --json; }
io() {
  "$B" bench io "$1" --ranks "$IO_RANKS" --file-per-rank --transfer-size 4k --block-size 64m --json --no-progress
}
show_md() {
  python3 -c '
import json, sys
r = json.load(sys.stdin)["run"]
out = []
for p in r["phases"]:
    cpu = p.get("service_cpu_us_per_op", {})
    meta = sum(v for k, v in cpu.items() if k.startswith("meta"))
    s = "%s %.0f/s" % (p["phase"], p["ops_per_s"])
    if cpu:
        s += " meta %.0fus mount %.0fus" % (meta, cpu.get("mount", 0))
    out.append(s)
print(" | ".join(out))'
}
# Context switches of all the mount's threads so far (each wake-up of a sleeping thread is one).
ctx() {
  cat /proc/"$(cat "$D/fs/client/mount.pid")"/task/*/status 2>/dev/null |
    awk '/^(non)?voluntary_ctxt_switches/ { n += $2 } END { print n + 0 }'
}
show_io() {
  python3 -c '
import json, sys
r = json.load(sys.stdin)
print("4k write %.0f MiB/s | 4k read %.0f MiB/s" % (r["write"]["aggregate_mib_s"], r["read"]["aggregate_mib_s"]))'
}
for round in $(seq "$ROUNDS"); do
  for t in dev io_uring; do
    if [ "$t" = dev ]; then echo N > "$P"; else echo Y > "$P"; fi
    fresh
    rm -rf "$D/fs"
    "$B" up --dir "$D/fs" --mount "$W/mnt" >/dev/null
    if grep -q "FUSE over io_uring: .* registered" "$D/fs/client/mount.log"; then got=io_uring; else got=dev; fi
    [ "$got" = "$t" ] || { echo "asked for $t, the mount uses $got" >&2; exit 1; }
    c0=$(ctx)
    r=$(md "$W/mnt" | show_md)
    c1=$(ctx)
    # bench md makes RANKS x FILES files and runs four phases over them.
    echo "round $round $t md: $r | mount switches/op $(python3 -c "print('%.2f' % (($c1 - $c0) / (4 * $RANKS * $FILES)))")"
    echo "round $round $t io: $(io "$W/mnt" | show_io)"
    "$B" down --dir "$D/fs" >/dev/null
  done
  fresh
  mkdir -p "$D/bsrc"
  bindfs --multithreaded -o big_writes,max_write=131072 "$D/bsrc" "$W/bmnt"
  echo "round $round bindfs md: $(md "$W/bmnt" | show_md)"
  echo "round $round bindfs io: $(io "$W/bmnt" | show_io)"
  fusermount3 -u "$W/bmnt"
done
