#!/usr/bin/env bash
# Emulated clusters that reproduce the seed striping study's findings (seed 000, Figures 6,
# 8 and 10, lessons 6 and 7) on one machine, with `hivefs-testbed` network namespaces:
#
#   host mgmt    mgmtd + one metadata server
#   hosts s1, s2 one storage server each, 4 targets each
#   hosts c1..c4 client hosts (native client, no FUSE)
#
# Every service runs inside its host's namespace, bound to the host's address.
#
# Target layout. Target ids are given by mgmtd in registration order, and `roundrobin` takes
# `stripe` consecutive ids from a cursor that advances by the stripe count. The script
# registers the targets in the order s1:t1, s2:t1..t4, s1:t2..t4 (it starts s1 with its first
# target only, stops it, starts s2, then s1 with all four), so ids 1-8 lie on servers
# 1,2,2,2,2,1,1,1 — the seed's (101, 201, 202, 203) / (204, 102, 103, 104). With the cursor
# at a multiple of 4 (a fresh metadata server creating only stripe-4 roundrobin files),
# every file gets (1,3). The stripe-4 roundrobin runs therefore go first, in their own sweep.
#
# Scenario 1 (network slower than storage): each storage host's link shaped with tc tbf
#   (RATE1); `bench sweep` over stripe counts 1..8 with roundrobin and balanced.
# Scenario 2 (storage slower than network): no shaping; every target limited to RATE2
#   bytes/s by the storage service (`target_rate_limit`); balanced, stripe counts 1..8.
# Concurrent applications (in scenario 2's setting): 1, 2 and 4 client hosts each run
#   `bench io` at the same time in their own directory over all 8 targets;
#   `bench combine` gives the aggregate (Equation 1).
#
# Usage: bench/emulated.sh [--quick] [--out DIR]
#   --quick   shortened run (CI): fewer repetitions, smaller volumes (about 2-3 minutes)
#   --out DIR results (default: emulated-results); holds scenario1.jsonl, scenario2.jsonl,
#             apps.jsonl, figures in scenario1/ (all, balanced/, roundrobin/) and scenario2/,
#             layout.txt, summary.txt and the services' logs in work/
# Environment: HIVEFS, TESTBED: the binaries (default target/release/hivefs and
#   target/release/hivefs-testbed); RATE1 (default 200mbit), RATE2 (default 16MiB).
# Needs root (network namespaces, tc), python3.
set -euo pipefail

QUICK=0
OUT=emulated-results
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=1 ;;
    --out) OUT=$2; shift ;;
    -h|--help) sed -n '2,35p' "$0"; exit 0 ;;
    *) echo "emulated.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

HIVEFS=$(realpath "${HIVEFS:-target/release/hivefs}")
TESTBED=$(realpath "${TESTBED:-target/release/hivefs-testbed}")
RATE1=${RATE1:-200mbit}
RATE2=${RATE2:-16MiB}
if [ "$QUICK" = 1 ]; then
  RR4_REPS=3; R1=2; R1_RR=1; BLOCK1=8m
  STRIPES2=1,2,4,8; R2=1; BLOCK2=8m
  APP_REPS=1; APP_BLOCK=16m
else
  RR4_REPS=10; R1=5; R1_RR=5; BLOCK1=32m
  STRIPES2=1,2,3,4,5,6,7,8; R2=3; BLOCK2=32m
  APP_REPS=3; APP_BLOCK=64m
fi

mkdir -p "$OUT"
OUT=$(realpath "$OUT")
WORK=$OUT/work
rm -rf "$WORK" "$OUT"/scenario1 "$OUT"/scenario2 "$OUT"/apps
rm -f "$OUT"/*.jsonl "$OUT"/summary.txt "$OUT"/layout.txt
mkdir -p "$WORK"
NAME=emu-$$
declare -A PIDS LOGS
STARTS=0

log() { echo "emulated: $*" >&2; }
die() { log "$*"; exit 1; }

cleanup() {
  local rc=$?
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  "$TESTBED" destroy "$NAME" >/dev/null 2>&1 || true
  [ $rc = 0 ] || log "failed (exit $rc); service logs in $WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---------------------------------------------------------------- test bed and services
"$TESTBED" create "$NAME" --hosts mgmt,s1,s2,c1,c2,c3,c4 --owner-pid $$ >"$WORK/testbed.txt"
ip_of() { awk -v h="$1" '$1 == h { print $2 }' "$WORK/testbed.txt"; }
MGMTD=$(ip_of mgmt):8008
SECRET=$WORK/secret
(umask 077; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$SECRET"; echo >>"$SECRET")
FS_UUID=$(cat /proc/sys/kernel/random/uuid)

on() { local host=$1; shift; "$TESTBED" exec "$NAME" "$host" -- "$@"; }
admin() { on mgmt "$HIVEFS" "$@" --mgmtd "$MGMTD" --secret-file "$SECRET"; }

# start_svc NAME HOST ARGS...: `hivefs ARGS` in the background on HOST, logging to work/NAME.log.
start_svc() {
  local name=$1 host=$2; shift 2
  STARTS=$((STARTS + 1))
  LOGS[$name]=$WORK/$name.$STARTS.log
  "$TESTBED" exec "$NAME" "$host" -- "$HIVEFS" "$@" --secret-file "$SECRET" >"${LOGS[$name]}" 2>&1 &
  PIDS[$name]=$!
}
stop_svc() {
  kill "${PIDS[$1]}" 2>/dev/null || true
  wait "${PIDS[$1]}" 2>/dev/null || true
  unset "PIDS[$1]"
}
check_alive() {
  for n in "${!PIDS[@]}"; do
    kill -0 "${PIDS[$n]}" 2>/dev/null || die "service $n exited; see ${LOGS[$n]}"
  done
}

# wait_storage NAME...: until each storage service has registered and serves (its log says so).
wait_storage() {
  for s in "$@"; do
    for _ in $(seq 1 600); do
      check_alive
      grep -q "storage service started" "${LOGS[$s]}" && continue 2
      sleep 0.1
    done
    die "timed out waiting for $s to start; see ${LOGS[$s]}"
  done
}

# wait_online N: until the metadata node and all N registered targets (with space) are online.
wait_online() {
  local want=$1
  for _ in $(seq 1 600); do
    check_alive
    local t n
    t=$(admin targets --json 2>/dev/null || echo '[]')
    n=$(admin nodes --json 2>/dev/null || echo '[]')
    if python3 -c '
import json, sys
t, n, want = json.loads(sys.argv[1]), json.loads(sys.argv[2]), int(sys.argv[3])
on = [x for x in t if x["state"] == "online" and x["total_bytes"] > 0]
meta = [x for x in n if x["type"] == "meta" and x["state"] == "online"]
sys.exit(0 if len(on) == want and len(t) == want and meta else 1)' "$t" "$n" "$want"; then
      return 0
    fi
    sleep 0.2
  done
  die "timed out waiting for $want targets online"
}

# storage_svc HOST CONFIG TARGET...: a storage server on HOST with the given targets.
storage_svc() {
  local host=$1 cfg=$2; shift 2
  local args=(storage --dir "$WORK/$host" --listen "$(ip_of "$host"):8003" --mgmtd "$MGMTD"
    --fs-uuid "$FS_UUID" --config "$cfg")
  for t in "$@"; do args+=(--target "$WORK/$host/target$t"); done
  start_svc "storage-$host" "$host" "${args[@]}"
}

: >"$WORK/storage.toml"
printf 'target_rate_limit = "%s"\n' "$RATE2" >"$WORK/storage-limited.toml"
for h in s1 s2; do
  targets=()
  for t in 1 2 3 4; do targets+=(--target "$WORK/$h/target$t"); done
  "$HIVEFS" storage --init --fs-uuid "$FS_UUID" "${targets[@]}" >/dev/null
done

start_svc mgmtd mgmt mgmtd --dir "$WORK/mgmtd" --listen "$MGMTD"
start_svc meta mgmt meta --dir "$WORK/meta" --listen "$(ip_of mgmt):8005" --mgmtd "$MGMTD"
# The registration order that lays the ids out as 1,2,2,2,2,1,1,1 (see the top).
storage_svc s1 "$WORK/storage.toml" 1
wait_storage storage-s1
stop_svc storage-s1
storage_svc s2 "$WORK/storage.toml" 1 2 3 4
wait_storage storage-s2
storage_svc s1 "$WORK/storage.toml" 1 2 3 4
wait_storage storage-s1
wait_online 8

node_of_host() { # storage node id registered at HOST's address
  admin nodes --json | python3 -c '
import json, sys
print(next(n["id"] for n in json.load(sys.stdin) if n["type"] == "storage" and n["address"].startswith(sys.argv[1] + ":")))' "$(ip_of "$1")"
}
N1=$(node_of_host s1); N2=$(node_of_host s2)
admin targets --json | python3 -c '
import json, sys
host = {int(sys.argv[1]): "s1", int(sys.argv[2]): "s2"}
for t in sorted(json.load(sys.stdin), key=lambda t: t["id"]):
    print("target %d -> storage node %d (host %s)" % (t["id"], t["node"], host[t["node"]]))' "$N1" "$N2" | tee "$OUT/layout.txt" >&2

sweep() { # sweep OUT ARGS...: `bench sweep` on client host c1 through the native client.
  local out=$1; shift
  on c1 "$HIVEFS" bench sweep --native --mgmtd "$MGMTD" --secret-file "$SECRET" --chunk-size 512k \
    --transfer-size 1m --ranks 2 --pause-min-ms 0 --pause-max-ms 100 --out "$out" "$@" >&2
}
report() { # report JSONL DIR [CHOOSER]
  local src=$1 dir=$2
  if [ $# -gt 2 ]; then
    mkdir -p "$dir"
    grep "\"chooser\":\"$3\"" "$src" >"$dir/runs.jsonl"
    src=$dir/runs.jsonl
  fi
  "$HIVEFS" bench report "$src" --out "$dir" >/dev/null
}

# ---------------------------------------------------------------- scenario 1
log "scenario 1: storage links shaped to $RATE1 each"
"$TESTBED" shape "$NAME" s1 "$RATE1"
"$TESTBED" shape "$NAME" s2 "$RATE1"
S1=$OUT/scenario1.jsonl
sweep "$S1" --chooser roundrobin --stripe 4 --repeat "$RR4_REPS" --seed 1 --block-size "$BLOCK1"
sweep "$S1" --chooser roundrobin --stripe 1,2,3,5,6,7,8 --repeat "$R1_RR" --seed 2 --block-size "$BLOCK1"
sweep "$S1" --chooser balanced --stripe 1,2,3,4,5,6,7,8 --repeat "$R1" --seed 3 --block-size "$BLOCK1"
report "$S1" "$OUT/scenario1"
report "$S1" "$OUT/scenario1/balanced" balanced
report "$S1" "$OUT/scenario1/roundrobin" roundrobin
"$TESTBED" unshape "$NAME" s1
"$TESTBED" unshape "$NAME" s2

# ---------------------------------------------------------------- scenario 2
log "scenario 2: no shaping, every target limited to $RATE2/s"
stop_svc storage-s1
stop_svc storage-s2
storage_svc s1 "$WORK/storage-limited.toml" 1 2 3 4
storage_svc s2 "$WORK/storage-limited.toml" 1 2 3 4
wait_storage storage-s1 storage-s2
wait_online 8
grep -q "target rate limit" "${LOGS[storage-s1]}" || die "storage-s1 did not apply target_rate_limit"
S2=$OUT/scenario2.jsonl
sweep "$S2" --chooser balanced --stripe "$STRIPES2" --repeat "$R2" --seed 4 --block-size "$BLOCK2"
report "$S2" "$OUT/scenario2"

# ---------------------------------------------------------------- concurrent applications
log "concurrent applications: 1, 2 and 4 client hosts, all 8 targets, scenario 2's limits"
mkdir -p "$OUT/apps"
for rep in $(seq 1 "$APP_REPS"); do
  for n in 1 2 4; do
    d=$OUT/apps/$n-apps-rep$rep
    mkdir -p "$d"
    apps=()
    for i in $(seq 1 "$n"); do
      on "c$i" "$HIVEFS" bench io --native --mgmtd "$MGMTD" --secret-file "$SECRET" --json --no-progress \
        --ranks 2 --transfer-size 1m --block-size "$APP_BLOCK" >"$d/c$i.json" 2>"$d/c$i.err" &
      apps+=($!)
    done
    for p in "${apps[@]}"; do wait "$p" || die "a bench io of $d failed: $(cat "$d"/*.err)"; done
    "$HIVEFS" bench combine --json "$d"/c*.json >"$d/combined.json"
    python3 -c '
import json, sys
c = json.load(open(sys.argv[1]))
c["apps_count"], c["repetition"] = int(sys.argv[2]), int(sys.argv[3])
print(json.dumps(c))' "$d/combined.json" "$n" "$rep" >>"$OUT/apps.jsonl"
  done
done

# ---------------------------------------------------------------- summary
python3 - "$OUT" >"$OUT/summary.txt" <<'EOF'
import json, os, statistics, sys
out = sys.argv[1]
def runs(name):
    return [json.loads(l) for l in open(os.path.join(out, name)) if l.strip()]
def med(xs):
    return statistics.median(xs) if xs else float("nan")
s1, s2 = runs("scenario1.jsonl"), runs("scenario2.jsonl")
print("Scenario 1 (network slower than storage): median MiB/s (runs) by chooser and stripe count")
for ch in ("roundrobin", "balanced"):
    for k in range(1, 9):
        r = [x for x in s1 if x["chooser"] == ch and x["stripe_count"] == k]
        if r:
            allocs = sorted({x["allocation"] for x in r})
            print(f"  {ch:<10} stripe {k}: write {med([x['write_mib_s'] for x in r]):7.1f}  read "
                  f"{med([x['read_mib_s'] for x in r]):7.1f}  ({len(r)} runs, allocations {' '.join(allocs)})")
print("Scenario 1: median MiB/s by (min,max) allocation, both choosers")
by = {}
for x in s1:
    by.setdefault((x["alloc_min"], x["alloc_max"]), []).append(x)
for (a, b), r in sorted(by.items()):
    print(f"  ({a},{b}): write {med([x['write_mib_s'] for x in r]):7.1f}  read {med([x['read_mib_s'] for x in r]):7.1f}"
          f"  ({len(r)} runs)")
def ratio(num, den, key):
    n = med([x[key] for x in num]); d = med([x[key] for x in den])
    return n / d if d else float("nan")
kk = [x for x in s1 if x["alloc_min"] == x["alloc_max"] and x["alloc_min"] > 0]
zk = [x for x in s1 if x["alloc_min"] == 0]
print(f"  (k,k) vs (0,k): write {ratio(kk, zk, 'write_mib_s'):.2f}x  read {ratio(kk, zk, 'read_mib_s'):.2f}x")
print("Scenario 2 (storage slower than network): median MiB/s by stripe count (balanced)")
for k in range(1, 9):
    r = [x for x in s2 if x["stripe_count"] == k]
    if r:
        print(f"  stripe {k}: write {med([x['write_mib_s'] for x in r]):7.1f}  read {med([x['read_mib_s'] for x in r]):7.1f}"
              f"  ({len(r)} runs)")
one = [x for x in s2 if x["stripe_count"] == 1]; top = [x for x in s2 if x["stripe_count"] == max(y["stripe_count"] for y in s2)]
print(f"  stripe {top[0]['stripe_count']} vs stripe 1: write {ratio(top, one, 'write_mib_s'):.2f}x  read {ratio(top, one, 'read_mib_s'):.2f}x")
apps = runs("apps.jsonl")
print("Concurrent applications (scenario 2 limits, stripe 8): median aggregate MiB/s (Equation 1)")
base = {}
for n in (1, 2, 4):
    r = [x for x in apps if x["apps_count"] == n]
    w, rd = med([x["write"]["aggregate_mib_s"] for x in r]), med([x["read"]["aggregate_mib_s"] for x in r])
    base.setdefault("w", w); base.setdefault("r", rd)
    each = med([a["write"]["mib_s"] for x in r for a in x["apps"]])
    print(f"  {n} app(s): write {w:7.1f} ({w / base['w']:.2f}x of 1 app)  read {rd:7.1f} ({rd / base['r']:.2f}x)"
          f"  per-app write {each:6.1f}  ({len(r)} repetitions)")
EOF
cat "$OUT/summary.txt"
log "done: results in $OUT"
