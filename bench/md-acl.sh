#!/usr/bin/env bash
# bench md through two extra mounts of one `hivefs up`, the same build and kind of
# process: POSIX ACLs on (the default) and `--no-acl`, plus the ACL mount in a directory
# with a default ACL (every file inherits one), interleaved per round. Prints creates/s
# and the other phases, metadata CPU per create and metadata requests per phase.
# Needs setfacl (Debian package acl); root.
# Usage: bench/md-acl.sh WORKDIR [HIVEFS_BINARY]   (env: ROUNDS=6 RANKS=2 FILES=5000)
set -euo pipefail
W=$1; B=${2:-hivefs}
ROUNDS=${ROUNDS:-6}; RANKS=${RANKS:-2}; FILES=${FILES:-5000}
rm -rf "$W/fs"; mkdir -p "$W/fs" "$W/mnt" "$W/acl" "$W/noacl"
"$B" up --dir "$W/fs" --mount "$W/mnt" --storage 1 --targets-per-storage 1 >/dev/null
trap 'umount "$W/acl" "$W/noacl" 2>/dev/null || true; "$B" down --dir "$W/fs" >/dev/null 2>&1 || true' EXIT
port=$(sed -n 's/^mgmtd_port = //p' "$W/fs/fs.toml")
for m in acl noacl; do
  flag=(); [ "$m" = noacl ] && flag=(--no-acl)
  setsid "$B" mount --mgmtd "127.0.0.1:$port" --secret-file "$W/fs/secret" "${flag[@]}" "$W/$m" >"$W/$m.log" 2>&1 &
done
for m in acl noacl; do
  for _ in $(seq 50); do mountpoint -q "$W/$m" && break; sleep 0.2; done
done
mkdir -p "$W/acl/on" "$W/noacl/off" "$W/acl/dflt"
setfacl -d -m u:65534:rwx "$W/acl/dflt"
md() { "$B" bench md "$1" --ranks "$RANKS" --files "$FILES" --no-progress --json; }
show() { python3 -c 'import json,sys; r=json.load(sys.stdin)["run"]; p={x["phase"]: x for x in r["phases"]}
print(" ".join("%s %.0f/s" % (k, v["ops_per_s"]) for k, v in p.items()),
      "| meta us/create %.1f" % p["create"]["service_cpu_us_per_op"].get("meta1", 0),
      "| meta requests", {k: sum(v["meta_requests"].values()) for k, v in p.items()})'; }
for round in $(seq "$ROUNDS"); do
  for v in on:acl/on off:noacl/off default-acl:acl/dflt; do
    echo "round $round ${v%%:*}: $(md "$W/${v#*:}" | show)"
  done
done
