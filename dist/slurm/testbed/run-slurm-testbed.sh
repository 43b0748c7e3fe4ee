#!/bin/bash
# A real Slurm cluster (munged, slurmctld, slurmd on 3 nodes) inside a HiveFS
# network-namespace test bed, running jobs with --hivefs through the real
# hivefs_spank.so, prolog and epilog of dist/slurm. Checks what each job and each
# node saw, then tears everything down (also on failure or Ctrl-C).
#
# Until `hivefs ond` exists, HIVEFS_BIN is a stub (written below) that records
# its arguments and makes the mount point and data directory on each node the
# way `ond` would over ssh, plus one detached "service" process per node.
#
# Usage: run-slurm-testbed.sh [--keep] [--hold]     (as root)
#   --keep   leave the work directory (logs, configs, records) after success
#   --hold   after the checks, keep the cluster running until $WORK/hold is
#            removed (or Ctrl-C), to try things by hand; implies --keep
# Environment:
#   HIVEFS_TESTBED   hivefs-testbed binary (default: target/debug/hivefs-testbed
#                    of this repository, else of /work/main, else PATH)
#   NODES            compute nodes, 2 to 4 (default 3)
#   PROCTRACK        ProctrackType (default proctrack/linuxproc; proctrack/pgid works
#                    too but each batch job then ends ~3 s late)
# Needs: slurmctld slurmd slurm-client munge libslurm-dev gcc make util-linux
# (nsenter, unshare, setpriv), iproute2, and the test bed's own needs.
#
# Layout: one test bed host per Slurm host: ctl (slurmctld; also where jobs are
# submitted) and n1..nN (slurmd). Each host is an anchor process
# `unshare --mount --uts --propagation private sleep infinity` inside the
# host's network namespace; every process of the host is started with
# `nsenter --target ANCHOR --mount --uts --net`. In its mount namespace a host
# has its own /run (tmpfs), /var/lib/slurm, /var/log/slurm, /mnt, /srv, and
# the test bed's shared /etc/slurm, /etc/hosts and /run/munge. One munged, in
# the root namespaces, serves all hosts through its unix socket.
set -euo pipefail

KEEP=0 HOLD=0
for a in "$@"; do
	case $a in
	--keep) KEEP=1 ;;
	--hold) HOLD=1 KEEP=1 ;;
	*) echo "usage: $0 [--keep] [--hold]" >&2; exit 2 ;;
	esac
done
NODES=${NODES:-3}
case $NODES in 2 | 3 | 4) ;; *) echo "NODES must be 2, 3 or 4" >&2; exit 2 ;; esac
HERE=$(cd "$(dirname "$0")" && pwd)
DIST=$(cd "$HERE/.." && pwd)
REPO=$(cd "$DIST/../.." && pwd)

say() { printf '[%6.2fs] %s\n' "$(elapsed)" "$*"; }
T0=$(date +%s.%N)
elapsed() { echo "$(date +%s.%N) - $T0" | bc; }
die() { say "FAILED: $*"; exit 1; }
# wait_for SECONDS WHAT COMMAND...: polls COMMAND every 0.1 s.
wait_for() {
	local limit=$1 what=$2 start
	shift 2
	start=$(date +%s.%N)
	while ! "$@" >/dev/null 2>&1; do
		if [ "$(echo "$(date +%s.%N) - $start > $limit" | bc)" = 1 ]; then
			die "$what: not within $limit s"
		fi
		sleep 0.1
	done
	say "$what after $(echo "$(date +%s.%N) - $start" | bc | xargs printf '%.2f') s"
}

[ "$(id -u)" = 0 ] || die "needs root"
for c in slurmctld slurmd sbatch srun scontrol sinfo squeue munged munge unmunge setpriv nsenter unshare cc make bc; do
	command -v "$c" >/dev/null || die "missing command $c (packages: slurmctld slurmd slurm-client munge libslurm-dev gcc make bc util-linux)"
done
[ -f /usr/include/slurm/spank.h ] || die "missing /usr/include/slurm/spank.h (package libslurm-dev)"
if [ -z "${HIVEFS_TESTBED:-}" ]; then
	for t in "$REPO/target/debug/hivefs-testbed" /work/main/target/debug/hivefs-testbed; do
		[ -x "$t" ] && HIVEFS_TESTBED=$t && break
	done
	HIVEFS_TESTBED=${HIVEFS_TESTBED:-hivefs-testbed}
fi
command -v "$HIVEFS_TESTBED" >/dev/null || die "no hivefs-testbed binary (set HIVEFS_TESTBED)"

WORK=$(mktemp -d /tmp/hivefs-slurm.XXXXXX)
chmod 755 "$WORK"
BED=slurm-$$
HOSTS=(ctl)
for i in $(seq 1 "$NODES"); do HOSTS+=("n$i"); done
COMPUTE=("${HOSTS[@]:1}")
declare -A IP NETNS ANCHOR
PIDS=()          # daemons started here (children of this shell)
BED_MADE=0

cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	set +eu
	say "teardown"
	# Daemons started here: SIGTERM, 10 s, SIGKILL.
	if [ ${#PIDS[@]} -gt 0 ]; then
		kill -TERM "${PIDS[@]}" 2>/dev/null
		for _ in $(seq 100); do
			local alive=0 p
			for p in "${PIDS[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
			[ $alive = 0 ] && break
			sleep 0.1
		done
		kill -KILL "${PIDS[@]}" 2>/dev/null
	fi
	# Whatever else runs in a host's mount namespace (slurmstepd, job tasks,
	# stub services), then the anchors: their namespaces, with every mount made
	# in them, go away with their last process.
	local h me p
	for h in "${!ANCHOR[@]}"; do
		me=$(readlink "/proc/${ANCHOR[$h]}/ns/mnt" 2>/dev/null) || continue
		for p in /proc/[0-9]*; do
			[ "${p#/proc/}" = "${ANCHOR[$h]}" ] && continue
			[ "$(readlink "$p/ns/mnt" 2>/dev/null)" = "$me" ] && kill -KILL "${p#/proc/}" 2>/dev/null
		done
		kill -KILL "${ANCHOR[$h]}" 2>/dev/null
	done
	for _ in $(seq 50); do # disowned children: bash reaps them
		local alive=0
		for p in "${PIDS[@]}" "${ANCHOR[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
		[ $alive = 0 ] && break
		sleep 0.1
	done
	[ $BED_MADE = 1 ] && "$HIVEFS_TESTBED" destroy "$BED" >/dev/null
	if [ $rc = 0 ] && [ $KEEP = 0 ]; then
		rm -rf "$WORK"
	else
		say "work directory kept: $WORK (logs: hosts/*/log, records/)"
	fi
	say "done (exit $rc)"
	exit $rc
}
trap cleanup EXIT
# Ctrl-C reaches the whole process group and stops at once; a SIGTERM sent to
# this shell alone takes effect when the current step (at most one job wait,
# 120 s) returns. Either way the EXIT trap tears everything down.
trap 'exit 130' INT TERM

# ---------------------------------------------------------------------------
say "work directory $WORK; building hivefs_spank.so"
make -s -C "$DIST" hivefs_spank.so
cp "$DIST/hivefs_spank.so" "$WORK/hivefs_spank.so"

say "test bed $BED: ${HOSTS[*]}"
out=$("$HIVEFS_TESTBED" create "$BED" --hosts "$(IFS=,; echo "${HOSTS[*]}")" --owner-pid $$)
BED_MADE=1
while read -r h ip _ ns; do
	IP[$h]=$ip
	NETNS[$h]=$ns
done < <(echo "$out" | awk '$3 == "netns" { print $1, $2, $3, $4 }')
for h in "${HOSTS[@]}"; do [ -n "${IP[$h]:-}" ] || die "test bed gave no address for $h"; done

# Files shared by all hosts.
mkdir -p "$WORK"/{etc-slurm,munge,munge-key,records,jobs,bin}
chmod 1777 "$WORK/records" "$WORK/jobs"
echo "127.0.0.1 localhost" >"$WORK/etc-hosts"
for h in "${HOSTS[@]}"; do echo "${IP[$h]} $h" >>"$WORK/etc-hosts"; done

# ---------------------------------------------------------------------------
say "anchors (mount + UTS namespace per host)"
for h in "${HOSTS[@]}"; do
	mkdir -p "$WORK/hosts/$h"/{lib/slurmd,lib/slurmctld,log,mnt,srv}
	setsid nsenter --net="/run/netns/${NETNS[$h]}" -- \
		unshare --mount --uts --propagation private sleep infinity </dev/null >/dev/null 2>&1 &
	ANCHOR[$h]=$!
	disown
done
anchored() { # the anchor has exec'd sleep in its own mount namespace
	[ "$(cat "/proc/$1/comm")" = sleep ] && [ "$(readlink "/proc/$1/ns/mnt")" != "$(readlink /proc/self/ns/mnt)" ]
}
for h in "${HOSTS[@]}"; do wait_for 5 "anchor $h (pid ${ANCHOR[$h]})" anchored "${ANCHOR[$h]}"; done
on() { # on HOST COMMAND...: run inside the host
	local h=$1
	shift
	nsenter --target "${ANCHOR[$h]}" --mount --uts --net -- "$@"
}
for h in "${HOSTS[@]}"; do
	mkdir -p /etc/slurm /var/lib/slurm /var/log/slurm /mnt /srv  # package dirs: mount points
	on "$h" sh -ec "
		hostname $h
		mount -t tmpfs -o mode=755 run-$h /run
		mkdir -p /run/munge /run/slurm
		mount --bind '$WORK/munge' /run/munge
		mount --bind '$WORK/etc-slurm' /etc/slurm
		mount --bind '$WORK/etc-hosts' /etc/hosts
		mount --bind '$WORK/hosts/$h/lib' /var/lib/slurm
		mount --bind '$WORK/hosts/$h/log' /var/log/slurm
		mount --bind '$WORK/hosts/$h/mnt' /mnt
		mount --bind '$WORK/hosts/$h/srv' /srv
	"
	echo "${ANCHOR[$h]}" >"$WORK/hosts/$h/anchor"
done

# ---------------------------------------------------------------------------
say "munged (one for all hosts; socket $WORK/munge/munge.socket.2 = /run/munge/munge.socket.2 in the hosts)"
dd if=/dev/urandom of="$WORK/munge-key/munge.key" bs=1024 count=1 status=none
chown -R munge:munge "$WORK/munge" "$WORK/munge-key"
chmod 700 "$WORK/munge-key"
chmod 400 "$WORK/munge-key/munge.key"
chmod 755 "$WORK/munge"
SOCK=$WORK/munge/munge.socket.2
setsid setpriv --reuid=munge --regid=munge --clear-groups -- munged --foreground \
	--socket="$SOCK" --key-file="$WORK/munge-key/munge.key" \
	--pid-file="$WORK/munge/munged.pid" --seed-file="$WORK/munge/munged.seed" \
	--log-file=/dev/null </dev/null >"$WORK/munged.out" 2>&1 &
PIDS+=($!)
disown
munge_ok() { munge -n -S "$SOCK" | unmunge -S "$SOCK"; }
wait_for 10 "munged up" munge_ok
on n1 sh -c 'munge -n | unmunge' >/dev/null || die "munge not reachable from inside a host"

# ---------------------------------------------------------------------------
say "stub hivefs, configs"
cat >"$WORK/bin/hivefs" <<EOF
#!/bin/bash
# Stand-in for \`hivefs ond\` (see run-slurm-testbed.sh). Records its arguments
# in $WORK/records/ond.log; "ssh to a node" is nsenter into the node's anchor.
WORK=$WORK
EOF
cat >>"$WORK/bin/hivefs" <<'EOF'
node=${SLURMD_NODENAME:-$(hostname)}
echo "$node $*" >>"$WORK/records/ond.log"
[ "$1" = ond ] || exit 2
verb=$2
shift 2
nodes= name= data= mount= local=0 fail=0 leak=0 sleep=0
for a in "$@"; do
	case $prev in
	--nodes) nodes=$a ;;
	--name) name=$a ;;
	--data) data=$a ;;
	--mount) mount=$a ;;
	esac
	case $a in
	--local) local=1 ;;
	--set=meta.stub_fail=1) fail=1 ;;
	--set=meta.stub_leak=1) leak=1 ;;
	--set=meta.stub_sleep=*) sleep=${a#--set=meta.stub_sleep=} ;;
	esac
	prev=$a
done
[ -n "$name" ] || exit 2
on() { local h=$1; shift; nsenter --target "$(cat "$WORK/hosts/$h/anchor")" --mount --uts --net -- "$@"; }
case $verb in
start)
	sleep "$sleep"
	for n in ${nodes//,/ }; do
		# Like ond's services: a new session, no inherited stdout/stderr
		# (slurmd waits for EOF on the prolog's output, and kills the
		# prolog's process group when it ends).
		on "$n" bash -c '
			mkdir -p "$1" "$2" && echo "$4" >"$2/stub"
			setsid bash -c "while :; do sleep 1; done" hivefs-stub-service --data="$2" </dev/null >/dev/null 2>&1 &
			echo $! >"$2/service.pid"
			[ "$3" = 1 ] && echo leak >"$2/leak"; true' _ "$mount" "$data" "$leak" "$node" || exit 1
	done
	[ $fail = 0 ] || { echo "stub: failing as asked" >&2; exit 1; }
	;;
stop)
	# Data and mount paths as `ond` would keep them: under the data dir
	# and mount base of the test's settings, by name.
	data=/srv/hivefs-ond/$name mount=/mnt/hivefs/$name
	stop_here() {
		[ -e "$data/leak" ] || kill "$(cat "$data/service.pid" 2>/dev/null)" 2>/dev/null
		[ -e "$data/leak" ] && return 0
		rm -rf "$data"; rmdir "$mount" 2>/dev/null; true
	}
	if [ $local = 1 ]; then
		stop_here
	else
		for n in ${nodes//,/ }; do
			on "$n" bash -c "$(declare -f stop_here); data=$data mount=$mount; stop_here"
		done
	fi
	;;
*) exit 2 ;;
esac
EOF
chmod 755 "$WORK/bin/hivefs"
HIVEFS_BIN_USED=${HIVEFS_BIN:-$WORK/bin/hivefs}

cat >"$WORK/etc-slurm/hivefs-slurm.conf" <<EOF
HIVEFS_BIN=$HIVEFS_BIN_USED
HIVEFS_DATA_DIR=/srv/hivefs-ond
HIVEFS_MOUNT_BASE=/mnt/hivefs
HIVEFS_LOG=/var/log/slurm/hivefs.log
HIVEFS_START_TIMEOUT=60
HIVEFS_STOP_TIMEOUT=20
HIVEFS_KILL_GRACE=5
EOF
# Prolog/Epilog wrappers: slurmd gives its scripts a fresh environment, so the
# settings file is named here; each also records that it ran.
for s in prolog epilog; do
	cat >"$WORK/etc-slurm/hivefs-$s" <<EOF
#!/bin/sh
echo "$s \$SLURMD_NODENAME \$SLURM_JOB_ID \${SPANK_HIVEFS-<unset>} \$SLURM_NODELIST \$(hostname)" >>$WORK/records/events
HIVEFS_SLURM_CONF=/etc/slurm/hivefs-slurm.conf exec $DIST/$s
EOF
	chmod 755 "$WORK/etc-slurm/hivefs-$s"
done
echo "required $WORK/hivefs_spank.so mount=/mnt/hivefs" >"$WORK/etc-slurm/plugstack.conf"
{
	cat <<EOF
ClusterName=hivetest
SlurmctldHost=ctl(${IP[ctl]})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=/var/lib/slurm/slurmctld
SlurmdSpoolDir=/var/lib/slurm/slurmd
SlurmctldPidFile=/run/slurm/slurmctld.pid
SlurmdPidFile=/run/slurm/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
SlurmctldDebug=debug
SlurmdDebug=debug
ProctrackType=${PROCTRACK:-proctrack/linuxproc}
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SlurmdParameters=config_overrides
PrologFlags=Alloc
Prolog=/etc/slurm/hivefs-prolog
Epilog=/etc/slurm/hivefs-epilog
PrologEpilogTimeout=180
EOF
	for h in "${COMPUTE[@]}"; do echo "NodeName=$h NodeAddr=${IP[$h]} CPUs=2 State=UNKNOWN"; done
	echo "PartitionName=debug Nodes=$(IFS=,; echo "${COMPUTE[*]}") Default=YES MaxTime=INFINITE State=UP"
} >"$WORK/etc-slurm/slurm.conf"

# ---------------------------------------------------------------------------
say "slurmctld on ctl"
setsid nsenter --target "${ANCHOR[ctl]}" --mount --uts --net -- slurmctld -D \
	</dev/null >"$WORK/hosts/ctl/slurmctld.out" 2>&1 &
PIDS+=($!)
disown
wait_for 30 "slurmctld answers" on ctl sh -c 'scontrol ping | grep -q "is UP"'
say "slurmd on ${COMPUTE[*]}"
for h in "${COMPUTE[@]}"; do
	setsid nsenter --target "${ANCHOR[$h]}" --mount --uts --net -- slurmd -D -N "$h" \
		</dev/null >"$WORK/hosts/$h/slurmd.out" 2>&1 &
	PIDS+=($!)
	disown
done
all_idle() { [ "$(on ctl sinfo -h -N -o '%T' | sort -u)" = idle ]; }
wait_for 60 "all $NODES nodes idle" all_idle

# ---------------------------------------------------------------------------
cat >"$WORK/jobs/job.sh" <<'EOF'
#!/bin/sh
echo "batch node=$SLURMD_NODENAME host=$(hostname) nodes=$SLURM_JOB_NODELIST"
echo "batch HIVEFS_MOUNT=${HIVEFS_MOUNT-<unset>} HIVEFS_NAME=${HIVEFS_NAME-<unset>}"
# stub: the node whose `ond start` made this node's data directory
srun -l sh -c 'echo "task host=$(hostname) HIVEFS_MOUNT=${HIVEFS_MOUNT-<unset>} stub=$(cat /srv/hivefs-ond/${HIVEFS_NAME:-x}/stub 2>/dev/null)"'
EOF
chmod 755 "$WORK/jobs/job.sh"
# submit SBATCH-ARGS...: prints the job id once the job has ended, fails unless it
# COMPLETED with exit code 0. (sbatch --wait polls slowly: seconds late.)
submit() {
	local id
	id=$(on ctl sbatch --parsable -D "$WORK/jobs" -o "$WORK/jobs/%j.out" "$@") || return 1
	wait_for 120 "job $id ended" job_ended "$id" >&2
	on ctl scontrol show job -o "$id" | grep -q 'JobState=COMPLETED .*ExitCode=0:0' || {
		on ctl scontrol show job -o "$id" >&2
		return 1
	}
	echo "$id"
}
job_ended() { [ -z "$(on ctl squeue -h -j "$1" -t PD,CF,R,CG -o %i)" ]; }
# quiet: no job in the queue, every node idle (epilogs done).
quiet() { [ -z "$(on ctl squeue -h)" ] && all_idle; }
events() { grep -E "^(prolog|epilog) [^ ]+ $1 " "$WORK/records/events" | sort; }
expect() { # expect WHAT EXPECTED ACTUAL
	if [ "$2" != "$3" ]; then
		printf 'expected:\n%s\ngot:\n%s\n' "$2" "$3"
		die "$1"
	fi
	say "ok: $1"
}
# node_clean HOST: no job mount point or data directory left on HOST.
node_clean() { [ -z "$(find "$WORK/hosts/$1/mnt" "$WORK/hosts/$1/srv" -mindepth 2)" ]; }
nodes_csv=$(IFS=,; echo "${COMPUTE[*]}")
first=${COMPUTE[0]}

say "job A: sbatch -N $NODES --hivefs=chunk-size=1m,stripe=2"
t=$(date +%s.%N)
A=$(submit -N "$NODES" --hivefs=chunk-size=1m,stripe=2 "$WORK/jobs/job.sh") || die "job A failed"
say "job A ($A) done in $(echo "$(date +%s.%N) - $t" | bc | xargs printf '%.2f') s (submit to end)"
wait_for 30 "job A's epilogs done" quiet
expect "A: prolog and epilog ran on every node, with SPANK_HIVEFS and the node list" \
	"$(for h in "${COMPUTE[@]}"; do
		echo "epilog $h $A chunk-size=1m,stripe=2 ${COMPUTE[0]%1}[1-$NODES] $h"
		echo "prolog $h $A chunk-size=1m,stripe=2 ${COMPUTE[0]%1}[1-$NODES] $h"
	done | sort)" "$(events "$A")"
port=$((12000 + (A % 2000) * 10))
expect "A: one ond start, on the first node, with the translated options" \
	"$first ond start --nodes $nodes_csv --name job$A --data /srv/hivefs-ond/job$A --mount /mnt/hivefs/job$A --chunk-size=1m --stripe=2 --port-base $port --timeout 60" \
	"$(grep " ond start .*--name job$A " "$WORK/records/ond.log")"
expect "A: ond stop --local on every node" \
	"$(for h in "${COMPUTE[@]}"; do echo "$h ond stop --local --name job$A --delete-data --timeout 20"; done | sort)" \
	"$(grep " ond stop .*--name job$A " "$WORK/records/ond.log" | sort)"
expect "A: the job saw HIVEFS_MOUNT on every node" \
	"$(i=0; for h in "${COMPUTE[@]}"; do echo "$i: task host=$h HIVEFS_MOUNT=/mnt/hivefs/job$A stub=$first"; i=$((i + 1)); done
	   echo "batch HIVEFS_MOUNT=/mnt/hivefs/job$A HIVEFS_NAME=job$A")" \
	"$(grep -E '^(batch HIVEFS|[0-9]+: task)' "$WORK/jobs/$A.out" | LC_ALL=C sort)"
for h in "${COMPUTE[@]}"; do
	node_clean "$h" || die "A: $h not clean"
done
say "ok: A: every node clean (no mount point, no data)"

say "job B: sbatch -N 2 without --hivefs"
B=$(submit -N 2 "$WORK/jobs/job.sh") || die "job B failed"
wait_for 30 "job B's epilogs done" quiet
! grep -q -- "--name job$B " "$WORK/records/ond.log" || die "B: ond ran for a job without --hivefs"
[ "$(events "$B" | awk '{ print $4 }' | sort -u)" = "<unset>" ] || die "B: SPANK_HIVEFS set"
[ "$(events "$B" | wc -l)" = 4 ] || die "B: expected 2 prologs and 2 epilogs"
expect "B: no HIVEFS_MOUNT in the job" \
	"$(printf '0: task host=%s HIVEFS_MOUNT=<unset> stub=\n1: task host=%s HIVEFS_MOUNT=<unset> stub=\nbatch HIVEFS_MOUNT=<unset> HIVEFS_NAME=<unset>' "${COMPUTE[0]}" "${COMPUTE[1]}")" \
	"$(grep -E '^(batch HIVEFS|[0-9]+: task)' "$WORK/jobs/$B.out" | LC_ALL=C sort)"

say "submission errors"
for bad in chunk-size=3m bogus=1 stripe=x,mirror chooser=fast 'set=meta.k=v,,mirror'; do
	if msg=$(on ctl sbatch -N 1 --hivefs="$bad" "$WORK/jobs/job.sh" 2>&1); then
		die "--hivefs=$bad was accepted: $msg"
	fi
	say "ok: --hivefs=$bad rejected: $(echo "$msg" | head -1)"
done

say "job C: srun -N 2 --hivefs=stripe=1,set=meta.stub_leak=1 (srun allocates; the stub leaves its services running)"
t=$(date +%s.%N)
# shellcheck disable=SC2016 # expanded by the task
out=$(on ctl timeout 120 srun -N 2 -D "$WORK/jobs" --hivefs=stripe=1,set=meta.stub_leak=1 \
	sh -c 'echo "$SLURM_JOB_ID $(hostname) $HIVEFS_MOUNT"') || die "job C failed"
C=$(echo "$out" | awk 'NR == 1 { print $1 }')
say "job C ($C) done in $(echo "$(date +%s.%N) - $t" | bc | xargs printf '%.2f') s"
expect "C: tasks saw HIVEFS_MOUNT" \
	"$(printf '%s %s /mnt/hivefs/job%s\n%s %s /mnt/hivefs/job%s' "$C" "${COMPUTE[0]}" "$C" "$C" "${COMPUTE[1]}" "$C")" \
	"$(echo "$out" | sort)"
wait_for 30 "job C's epilogs done" quiet
[ "$(events "$C" | awk '{ print $4 }' | sort -u)" = "stripe=1,set=meta.stub_leak=1" ] || die "C: SPANK_HIVEFS"
grep -q "ond start --nodes ${COMPUTE[0]},${COMPUTE[1]} --name job$C .* --stripe=1 --set=meta.stub_leak=1 " "$WORK/records/ond.log" || die "C: ond start"
if pgrep -f -- "--data=/srv/hivefs-ond/job$C\$" >/dev/null; then die "C: the epilog left the stub services running"; fi
for h in "${COMPUTE[0]}" "${COMPUTE[1]}"; do
	grep -q "killing leftover processes of /srv/hivefs-ond/job$C" "$WORK/hosts/$h/log/hivefs.log" || die "C: $h: no leftover kill logged"
	node_clean "$h" || die "C: $h not clean"
done
say "ok: C: the epilog killed the services ond stop left, and cleaned every node"

say "job D: a failing ond start (--hivefs=set=meta.stub_fail=1)"
D=$(on ctl sbatch --parsable -N 2 -D "$WORK/jobs" --hivefs=set=meta.stub_fail=1 "$WORK/jobs/job.sh")
held() { on ctl squeue -h -j "$D" -o '%T %r' | grep -q 'PENDING launch failed requeued held'; }
wait_for 60 "job D requeued held" held
drained() { on ctl sinfo -h -n "$first" -o '%T %E' | grep -Eq '^drain(ed|ing) Prolog error'; }
wait_for 30 "first node $first drained (Prolog error)" drained
grep -q "$first ond stop --nodes ${COMPUTE[0]},${COMPUTE[1]} --name job$D --delete-data" "$WORK/records/ond.log" || die "D: no cleanup after the failed start"
on ctl scancel "$D"
on ctl scontrol update nodename="$first" state=resume
wait_for 30 "nodes idle again" quiet
for h in "${COMPUTE[@]}"; do
	node_clean "$h" || die "D: $h not clean"
done
say "ok: D: failed start cleaned up, job held, node drained, then resumed"

say "all checks passed"
if [ $HOLD = 1 ]; then
	touch "$WORK/hold"
	say "holding; enter a host with: nsenter --target \$(cat $WORK/hosts/ctl/anchor) --mount --uts --net -- bash"
	say "stop with: rm $WORK/hold"
	while [ -e "$WORK/hold" ]; do sleep 1; done
fi
