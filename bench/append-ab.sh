#!/usr/bin/env bash
# O_APPEND against plain small writes through one mount: one process writes N records of
# SIZE bytes with O_APPEND, then the same records with plain writes (its own offset), to
# a file of its own, on a fresh `hivefs up` (defaults), ROUNDS rounds; then two processes
# on two mounts append N records each to one file, and the file is checked. Prints
# records/s per case. Root.
# Usage: bench/append-ab.sh WORKDIR HIVEFS_BINARY   (env: N=20000 SIZE=4 ROUNDS=3)
set -euo pipefail
W=$1; B=$2
N=${N:-20000}; SIZE=${SIZE:-4}; ROUNDS=${ROUNDS:-3}
mkdir -p "$W/mnt" "$W/m2"
cleanup() { fusermount3 -u "$W/m2" 2>/dev/null || true; "$B" down --dir "$W/fs" >/dev/null 2>&1 || true; }
trap cleanup EXIT
rate() { # path flags -> records/s
  python3 - "$1" "$2" "$N" "$SIZE" <<'PY'
import os, sys, time
path, mode, n, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | (os.O_APPEND if mode == "append" else 0)
fd = os.open(path, flags, 0o644)
rec = b"x" * (size - 1) + b"\n"
t = time.monotonic()
for _ in range(n):
    os.write(fd, rec)
os.close(fd)
print(round(n / (time.monotonic() - t)))
PY
}
for round in $(seq "$ROUNDS"); do
  rm -rf "$W/fs"; mkdir -p "$W/fs"
  "$B" up --dir "$W/fs" --mount "$W/mnt" >/dev/null
  sleep 2  # past the metadata node's grace for append locks after its start
  a=$(rate "$W/mnt/a" append); p=$(rate "$W/mnt/p" plain)
  echo "round $round append_per_s $a plain_per_s $p"
  MGMTD=$(tr '\0' ' ' <"/proc/$(cat "$W/fs/client/mount.pid")/cmdline" | sed -n 's/.*--mgmtd \([^ ]*\).*/\1/p')
  "$B" mount --mgmtd "$MGMTD" --secret-file "$W/fs/secret" "$W/m2" >"$W/m2.log" 2>&1 &
  for _ in $(seq 100); do mountpoint -q "$W/m2" && break; sleep 0.1; done
  : > "$W/mnt/shared"
  t0=$(date +%s.%N)
  python3 - "$W/mnt/shared" "$W/m2/shared" "$N" <<'PY'
import os, sys, threading
n = int(sys.argv[3])
def w(path, tag):
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    for i in range(n):
        os.write(fd, b"%s%09d\n" % (tag, i))
    os.close(fd)
ts = [threading.Thread(target=w, args=(p, t)) for p, t in ((sys.argv[1], b"A"), (sys.argv[2], b"B"))]
[t.start() for t in ts]; [t.join() for t in ts]
PY
  t1=$(date +%s.%N)
  python3 - "$W/mnt/shared" "$N" "$t0" "$t1" <<'PY'
import sys
data = open(sys.argv[1], "rb").read()
n = int(sys.argv[2]); recs = data.split(b"\n")[:-1]
seen = {b"A": 0, b"B": 0}
for r in recs:
    assert len(r) == 10 and int(r[1:]) == seen[r[:1]], "damaged or out of order: %r" % r
    seen[r[:1]] += 1
assert seen == {b"A": n, b"B": n} and len(data) == 2 * n * 11, seen
print("two mounts: %d records each, exact, %d records/s in all" % (n, 2 * n / (float(sys.argv[4]) - float(sys.argv[3]))))
PY
  cleanup
done
