#!/usr/bin/env bash
# Distribution of (min,max) stripe allocations per target chooser: creates
# FILES files with stripe 4 under each chooser on a 2-server x 4-target
# HiveFS and counts the allocations (seed 000's notation).
# Usage: bench/chooser-allocation.sh [FILES=1000] [HIVEFS=target/release/hivefs]
set -euo pipefail
FILES=${1:-1000}
HIVEFS=${2:-target/release/hivefs}
work=$(mktemp -d /tmp/hivefs-chooser.XXXXXX)
trap '$HIVEFS down --force --dir "$work/fs" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
$HIVEFS up --dir "$work/fs" --mount "$work/mnt" --storage 2 --targets-per-storage 4 >/dev/null
layout=$($HIVEFS targets --json --mount "$work/mnt" | python3 -c 'import json, sys; print(" ".join("%d->%d" % (t["id"], t["node"]) for t in sorted(json.load(sys.stdin), key=lambda t: t["id"])))')
echo "target -> storage node: $layout"
printf "%-24s %s\n" chooser "allocations (min,max): count"
for chooser in random roundrobin randomized-roundrobin balanced; do
  d="$work/mnt/$chooser"
  mkdir "$d"
  $HIVEFS pattern set "$d" --stripe 4 --chooser "$chooser" >/dev/null
  for i in $(seq 1 "$FILES"); do : > "$d/f$i"; done
  $HIVEFS entry info --json "$d"/f* | python3 -c '
import json, sys, collections
infos = json.load(sys.stdin)
c = collections.Counter((i["allocation"]["min"], i["allocation"]["max"]) for i in infos)
print("  ".join(f"({a},{b}): {n}" for (a, b), n in sorted(c.items())))
' | xargs -0 printf "%-24s %s" "$chooser"
done
