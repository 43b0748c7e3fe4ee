# Shared by dist/slurm/prolog and dist/slurm/epilog (sourced by bash): reads the
# shellcheck disable=SC2034 # the settings are used by the scripts that source this file
# settings and gives logging. Installed next to them.

hivefs_defaults() {
	HIVEFS_BIN=/usr/local/bin/hivefs
	HIVEFS_REMOTE_BIN=
	HIVEFS_DATA_DIR=/var/lib/hivefs/ond
	HIVEFS_MOUNT_BASE=/mnt/hivefs
	HIVEFS_SSH_CONFIG=
	HIVEFS_PORT_MIN=12000
	HIVEFS_PORT_STRIDE=10
	HIVEFS_PORT_SLOTS=2000
	HIVEFS_OND_START_OPTS=
	HIVEFS_OND_STOP_OPTS=
	HIVEFS_START_TIMEOUT=120
	HIVEFS_STOP_TIMEOUT=30
	HIVEFS_KILL_GRACE=15
	HIVEFS_LOG=/var/log/hivefs/slurm.log
	HIVEFS_SCONTROL=scontrol
}

# hivefs_log MESSAGE: one line to syslog (tag hivefs-slurm) and to $HIVEFS_LOG.
hivefs_log() {
	local line="$HIVEFS_WHAT job ${SLURM_JOB_ID:-?} on ${HIVEFS_NODE:-?}: $*"
	logger -t hivefs-slurm -- "$line" 2>/dev/null || true
	if [ -n "$HIVEFS_LOG" ]; then
		printf '%s %s\n' "$(date '+%Y-%m-%dT%H:%M:%S%z')" "$line" >>"$HIVEFS_LOG" 2>/dev/null || true
	fi
}

# hivefs_run TIMEOUT COMMAND...: runs COMMAND with stdin from /dev/null and its
# output appended to $HIVEFS_LOG (or dropped), killed after TIMEOUT seconds (and
# SIGKILLed HIVEFS_KILL_GRACE later). Returns its status (124: timed out).
hivefs_run() {
	local t=$1 rc
	shift
	hivefs_log "run: $*"
	if [ -n "$HIVEFS_LOG" ]; then
		timeout -k "$HIVEFS_KILL_GRACE" "$t" "$@" </dev/null >>"$HIVEFS_LOG" 2>&1
	else
		timeout -k "$HIVEFS_KILL_GRACE" "$t" "$@" </dev/null >/dev/null 2>&1
	fi
	rc=$?
	hivefs_log "exit $rc: $1 ${2:-} ${3:-}"
	return $rc
}

# hivefs_setup WHAT: settings, node name, job id. Exits 1 on a broken setup.
hivefs_setup() {
	HIVEFS_WHAT=$1
	# slurmd gives its prolog and epilog neither PATH nor HOME (ssh wants both).
	export PATH=${PATH:-/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin}
	export HOME=${HOME:-/root}
	HIVEFS_NODE=${SLURMD_NODENAME:-$(hostname -s)}
	hivefs_defaults
	local conf=${HIVEFS_SLURM_CONF:-/etc/hivefs/slurm.conf}
	if [ -e "$conf" ]; then
		# shellcheck disable=SC1090
		if ! . "$conf"; then
			hivefs_log "cannot read $conf"
			exit 1
		fi
	fi
	if [ -n "$HIVEFS_LOG" ]; then
		mkdir -p "$(dirname "$HIVEFS_LOG")" 2>/dev/null || true
	fi
	case ${SLURM_JOB_ID:-} in
	'' | *[!0-9]*)
		hivefs_log "SLURM_JOB_ID '${SLURM_JOB_ID:-}' is not a job id"
		exit 1
		;;
	esac
	local k
	for k in HIVEFS_PORT_MIN HIVEFS_PORT_STRIDE HIVEFS_PORT_SLOTS HIVEFS_START_TIMEOUT \
		HIVEFS_STOP_TIMEOUT HIVEFS_KILL_GRACE; do
		case ${!k} in
		'' | *[!0-9]*)
			hivefs_log "$conf: $k=${!k} is not a number"
			exit 1
			;;
		esac
	done
	HIVEFS_NAME=job$SLURM_JOB_ID
	HIVEFS_MOUNT=${HIVEFS_MOUNT_BASE%/}/$HIVEFS_NAME
	HIVEFS_DATA=${HIVEFS_DATA_DIR%/}/$HIVEFS_NAME
}

# hivefs_mounted PATH: is PATH a mount point here? Reads /proc/self/mountinfo
# (no stat: never blocks on a hung FUSE mount). Paths with spaces are not
# supported.
hivefs_mounted() {
	awk -v p="$1" '$5 == p { found = 1 } END { exit !found }' /proc/self/mountinfo
}
