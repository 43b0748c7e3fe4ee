#!/usr/bin/env bash
# Buddy mirroring's times on a fresh `hivefs up --mirror` (2 storage servers x 2 targets,
# failover_after_ms 3000): a full resync of 512 MiB (every group), the longest pause a
# writer (4 KiB append + fsync every 20 ms) sees when group 1's primary server is killed
# (-9), and the resync after that server returns. Root (FUSE).
# Usage: bench/mirror-failover.sh WORKDIR HIVEFS_BINARY
set -euo pipefail
W=$1 H=$2
D=$W/fs M=$W/mnt
"$H" down --dir "$D" --force >/dev/null 2>&1 || true
rm -rf "$D"; mkdir -p "$D/mgmtd"
printf 'probably_offline_after_ms = 1500\noffline_after_ms = 3000\nfailover_after_ms = 3000\n' > "$D/mgmtd/mgmtd.toml"
"$H" up --dir "$D" --mount "$M" --storage 2 --targets-per-storage 2 --mirror >/dev/null
trap '"$H" down --dir "$D" >/dev/null' EXIT
good() { # group -> waits until its secondary is good
  until "$H" mirror list --json --mount "$M" | python3 -c "import json,sys; g=[x for x in json.load(sys.stdin) if x['id']==$1][0]; sys.exit(0 if g['secondary']['state']=='good' else 1)"; do sleep 0.1; done
}
for i in 1 2 3 4; do head -c 128M /dev/urandom > "$M/f$i"; done
t0=$(date +%s.%N)
"$H" mirror resync --group 1 --full --mount "$M" 2>/dev/null
"$H" mirror resync --group 2 --full --mount "$M" 2>/dev/null
sleep 0.5; good 1; good 2
t1=$(date +%s.%N)
python3 -c "print('full resync of 512 MiB: %.2f s, %d MiB/s' % ($t1-$t0, 512/($t1-$t0)))"
python3 - "$M/pause" > "$W/pause.txt" <<'PY' &
import os, sys, time
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_APPEND)
end, last, worst = time.time() + 15, time.time(), 0.0
while time.time() < end:
    os.write(fd, b"x" * 4096); os.fsync(fd)
    now = time.time(); worst = max(worst, now - last); last = now
    time.sleep(0.02)
print("%.2f" % worst)
PY
sleep 3
P=$("$H" mirror list --json --mount "$M" | python3 -c "import json,sys; print(json.load(sys.stdin)[0]['primary']['id'])")
NODE=$("$H" targets --json --mount "$M" | python3 -c "import json,sys; print([t['node'] for t in json.load(sys.stdin) if t['id']==$P][0])")
for s in "$D"/storage*; do grep -q "node_id = $NODE\$" "$s/node.toml" && kill -9 "$(cat "$s"/storage*.pid)"; done
wait
echo "longest pause of the writer across the kill: $(cat "$W/pause.txt") s"
"$H" up --dir "$D" >/dev/null
t0=$(date +%s.%N); good 1; good 2; t1=$(date +%s.%N)
python3 -c "print('resync after the server returned: %.2f s' % ($t1-$t0))"
