#!/usr/bin/env bash
# What metrics and events cost: two file systems started the same way by `hivefs up`,
# A with metrics and events recorded (the default) and B without (HIVEFS_METRICS=off,
# HIVEFS_EVENTS=off in the services' and mount's environment); `hivefs bench md`
# (8 ranks x 1000 empty files, a directory per rank) and `hivefs bench io` (2 ranks,
# 256 MiB each, a file per rank) through each mount, alternating A and B for ROUNDS
# rounds. Prints every run and the median ratio A/B per figure. Root (FUSE).
# Usage: bench/metrics-ab.sh WORKDIR HIVEFS_BINARY     (env: ROUNDS=3)
set -euo pipefail
W=$1 H=$2 ROUNDS=${ROUNDS:-3}
for fs in a b; do "$H" down --dir "$W/$fs" --force >/dev/null 2>&1 || true; rm -rf "${W:?}/$fs"; done
mkdir -p "$W"
"$H" up --dir "$W/a" --mount "$W/ma" --storage 1 >/dev/null
HIVEFS_METRICS=off HIVEFS_EVENTS=off "$H" up --dir "$W/b" --mount "$W/mb" --storage 1 >/dev/null
trap '"$H" down --dir "$W/a" >/dev/null; "$H" down --dir "$W/b" >/dev/null' EXIT
md() {
  "$H" bench md "$1" --ranks 8 --files 1000 --json --no-progress 2>/dev/null | python3 -c '
import json, sys
print(" ".join("md_%s=%.0f" % (p["phase"], p["ops_per_s"]) for p in json.load(sys.stdin)["run"]["phases"]))'
}
io() {
  "$H" bench io "$1" --ranks 2 --block-size 256m --file-per-rank --json --no-progress 2>/dev/null | python3 -c '
import json, sys
r = json.load(sys.stdin)
print(" ".join("io_%s_mibs=%.0f" % (p, r[p]["aggregate_mib_s"]) for p in ("write", "read")))' 2>/dev/null || echo "io=?"
}
out=$(mktemp)
for round in $(seq "$ROUNDS"); do
  for fs in a b; do
    line="$fs round $round: $(md "$W/m$fs") $(io "$W/m$fs")"
    echo "$line" | tee -a "$out"
  done
done
python3 - "$out" <<'PY'
import sys, statistics, collections
vals = collections.defaultdict(lambda: collections.defaultdict(list))
for line in open(sys.argv[1]):
    fs, rest = line.split(" round ")
    for kv in rest.split(":", 1)[1].split():
        k, v = kv.split("=")
        try: vals[k][fs].append(float(v))
        except ValueError: pass
print("median A (on) / B (off):")
for k, d in vals.items():
    if d["a"] and d["b"]:
        print(f"  {k}: {statistics.median(d['a']) / statistics.median(d['b']):.3f}  (A {statistics.median(d['a']):.0f}, B {statistics.median(d['b']):.0f})")
PY
rm -f "$out"
