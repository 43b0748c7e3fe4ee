#!/usr/bin/env bash
# Same-run comparison of HiveFS against the local disk it lives on:
#   1. fio sequential 1 MiB write then read, 2 jobs, file per job, end_fsync;
#   2. small files: create N empty files, stat them, remove them.
# Usage: bench/fio-compare.sh MOUNT PLAIN_DIR [TOTAL_SIZE=2g] [FILES=10000]
# PLAIN_DIR must be on the disk that holds the storage targets.
set -euo pipefail
MNT=$1; PLAIN=$2; TOTAL=${3:-2g}; FILES=${4:-10000}
command -v fio >/dev/null || { echo "fio is required (apt-get install fio)" >&2; exit 1; }
per_job=$(numfmt --from=iec "${TOTAL^^}"); per_job=$((per_job / 2))
drop() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true; }
bw() { # dir rw -> MiB/s
  local d=$1 rw=$2
  fio --name=seq --directory="$d" --rw="$rw" --bs=1m --size="$per_job" --numjobs=2 \
      --ioengine=psync --end_fsync=1 --group_reporting --output-format=json 2>/dev/null |
    python3 -c "import json,sys; j=json.load(sys.stdin)['jobs'][0]; print(round(j['$rw' if '$rw'!='read' else 'read']['bw']/1024,1))"
}
small() { # dir -> "create/s stat/s remove/s"
  python3 - "$1" "$FILES" <<'PY'
import os, sys, time
d = os.path.join(sys.argv[1], "smallfiles"); n = int(sys.argv[2])
os.makedirs(d, exist_ok=True)
names = [os.path.join(d, f"f{i}") for i in range(n)]
t = time.perf_counter()
for p in names: os.close(os.open(p, os.O_CREAT | os.O_WRONLY, 0o644))
c = time.perf_counter() - t; t = time.perf_counter()
for p in names: os.stat(p)
s = time.perf_counter() - t; t = time.perf_counter()
for p in names: os.unlink(p)
r = time.perf_counter() - t
os.rmdir(d)
print(f"{n/c:.0f} {n/s:.0f} {n/r:.0f}")
PY
}
mkdir -p "$PLAIN/fio" "$MNT/fio"
declare -A R
for where in plain hivefs; do
  d=$PLAIN/fio; [ $where = hivefs ] && d=$MNT/fio
  R[$where.write]=$(bw "$d" write); drop
  R[$where.read]=$(bw "$d" read)
  rm -f "$d"/seq.*; drop
  read -r c s u < <(small "$(dirname "$d")")
  R[$where.create]=$c; R[$where.stat]=$s; R[$where.remove]=$u
done
rmdir "$PLAIN/fio" "$MNT/fio" 2>/dev/null || true
printf "%-22s %12s %12s %8s\n" metric plain hivefs ratio
for m in write read create stat remove; do
  unit="MiB/s"; case $m in create|stat|remove) unit="ops/s";; esac
  ratio=$(python3 -c "print(f'{${R[hivefs.$m]}/${R[plain.$m]}:.2f}x')")
  printf "%-22s %12s %12s %8s\n" "$m ($unit)" "${R[plain.$m]}" "${R[hivefs.$m]}" "$ratio"
done
