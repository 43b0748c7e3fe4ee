#!/bin/bash
# Tests of dist/slurm without a Slurm cluster: the plugin's option rules
# (test_opts.c) and the prolog/epilog, run by hand with a fake `scontrol` and a
# fake `hivefs` that records its arguments. The epilog's last-resort path (a
# hung `ond stop`, a mount left behind, services left running) runs in a
# private mount namespace, so it needs root; without root those cases are
# skipped. Prints "N passed, N failed"; exits 1 on any failure.
# The whole cluster recipe is testbed/run-slurm-testbed.sh.
# shellcheck disable=SC2015,SC2016 # "ok || bad" lines; scripts for other shells
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
DIST=$(cd "$HERE/.." && pwd)
T=$(mktemp -d /tmp/hivefs-slurm-test.XXXXXX)
trap 'rm -rf "$T"' EXIT
PASS=0 FAIL=0 SKIP=0
ok() { PASS=$((PASS + 1)); echo "ok: $*"; }
bad() { FAIL=$((FAIL + 1)); echo "FAIL: $*"; }

# -- plugin option rules -----------------------------------------------------
if cc -O1 -Wall -Wextra -Wno-format-truncation -o "$T/test_opts" "$HERE/test_opts.c" 2>"$T/cc.err"; then
	out=$("$T/test_opts")
	echo "$out" | grep FAIL
	p=$(echo "$out" | sed -n 's/.*: \([0-9]*\) passed, \([0-9]*\) failed$/\1/p')
	f=$(echo "$out" | sed -n 's/.*: \([0-9]*\) passed, \([0-9]*\) failed$/\2/p')
	PASS=$((PASS + ${p:-0}))
	FAIL=$((FAIL + ${f:-1}))
	echo "spank option rules: ${p:-0} passed, ${f:-1} failed"
else
	cat "$T/cc.err"
	bad "test_opts.c does not build (libslurm-dev installed?)"
fi

# -- fakes --------------------------------------------------------------------
mkdir -p "$T/bin"
cat >"$T/bin/scontrol" <<'EOF'
#!/bin/bash
# show hostnames LIST: LIST is a comma list of names or PREFIX[A-B] ranges.
[ "$1 $2" = "show hostnames" ] || exit 1
IFS=, read -ra parts <<<"$3"
for p in "${parts[@]}"; do
	if [[ $p =~ ^([a-z]+)\[([0-9]+)-([0-9]+)\]$ ]]; then
		for i in $(seq "${BASH_REMATCH[2]}" "${BASH_REMATCH[3]}"); do echo "${BASH_REMATCH[1]}$i"; done
	else
		echo "$p"
	fi
done
EOF
cat >"$T/bin/hivefs" <<EOF
#!/bin/bash
printf '%s\n' "\$*" >>"$T/calls"
case "\$2" in
start) exit \${FAKE_START_RC:-0} ;;
stop) [ -n "\${FAKE_STOP_SLEEP:-}" ] && exec sleep "\$FAKE_STOP_SLEEP"; exit \${FAKE_STOP_RC:-0} ;;
esac
EOF
chmod 755 "$T/bin/"*
cat >"$T/conf" <<EOF
HIVEFS_BIN=$T/bin/hivefs
HIVEFS_DATA_DIR=$T/data
HIVEFS_MOUNT_BASE=$T/mnt
HIVEFS_LOG=$T/log
HIVEFS_SCONTROL=$T/bin/scontrol
HIVEFS_START_TIMEOUT=30
HIVEFS_STOP_TIMEOUT=2
HIVEFS_KILL_GRACE=1
EOF

# run_script prolog|epilog VAR=VALUE...: runs it in a clean environment like
# slurmd's (no PATH, no HOME); sets RC and CALLS (the fake hivefs's calls).
run_script() {
	local s=$1
	shift
	: >"$T/calls"
	env -i SLURM_JOB_ID=42 SLURMD_NODENAME=n1 SLURM_NODELIST='n[1-3]' \
		HIVEFS_SLURM_CONF="$T/conf" "$@" /bin/bash "$DIST/$s" >"$T/out" 2>&1
	RC=$?
	CALLS=$(cat "$T/calls")
}
expect() { # expect NAME WANT_RC WANT_CALLS
	if [ "$RC" = "$2" ] && [ "$CALLS" = "$3" ]; then
		ok "$1"
	else
		bad "$1: exit $RC (want $2), calls:"
		printf '  %s\n' "$CALLS" "(want)" "$3"
		sed 's/^/  log: /' "$T/log" 2>/dev/null | tail -5
	fi
}

# -- prolog -------------------------------------------------------------------
M=$T/mnt/job42 D=$T/data/job42
START="ond start --nodes n1,n2,n3 --name job42 --data $D --mount $M"
TAIL="--port-base 12420 --timeout 30"

run_script prolog
expect "prolog: no --hivefs, nothing done" 0 ""
run_script prolog SPANK_HIVEFS=chunk-size=1m SLURMD_NODENAME=n2
expect "prolog: not the first node, nothing done" 0 ""
run_script prolog SPANK_HIVEFS=default
expect "prolog: bare --hivefs" 0 "$START $TAIL"
run_script prolog SPANK_HIVEFS=chunk-size=1m,stripe=4,chooser=balanced,meta=2,cache-mode=paged,mirror
expect "prolog: options become flags" 0 "$START --chunk-size=1m --stripe=4 --chooser=balanced --meta=2 --cache-mode=paged --mirror $TAIL"
run_script prolog 'SPANK_HIVEFS=set=meta.list=a\,b\\c,set=storage.x=1,meta-chooser=random,atime=relatime'
expect "prolog: set= with escaped comma and backslash" 0 \
	"$START --set=meta.list=a,b\\c --set=storage.x=1 --meta-chooser=random --atime=relatime $TAIL"
run_script prolog SPANK_HIVEFS=stripe=2 SLURM_JOB_ID=2041
expect "prolog: port base from the job id (2041 mod 2000 = 41)" 0 \
	"ond start --nodes n1,n2,n3 --name job2041 --data $T/data/job2041 --mount $T/mnt/job2041 --stripe=2 --port-base 12410 --timeout 30"
run_script prolog SPANK_HIVEFS=mirror SLURM_NODELIST=c5,a1 SLURMD_NODENAME=c5
expect "prolog: the first node is the list's first; order kept" 0 "ond start --nodes c5,a1 --name job42 --data $D --mount $M --mirror $TAIL"
run_script prolog SPANK_HIVEFS=mirror SLURM_NODELIST=c5,a1 SLURMD_NODENAME=a1
expect "prolog: a later node does nothing" 0 ""
run_script prolog SPANK_HIVEFS=mirror SLURM_NODELIST= SLURM_JOB_NODELIST=c5,n1 SLURMD_NODENAME=c5
expect "prolog: SLURM_JOB_NODELIST when present" 0 "ond start --nodes c5,n1 --name job42 --data $D --mount $M --mirror $TAIL"
for evil in 'chunk-size=1m --push' 'stripe=1;rm' 'bogus=1' 'mirror=1' 'stripe=2,stripe=3' \
	'set=fuse.x=1' 'chooser=$(id)' 'stripe=1,' 'a\b' $'stripe=1\nmirror' 'meta=0'; do
	run_script prolog "SPANK_HIVEFS=$evil"
	expect "prolog: rejects '$evil'" 1 ""
done
run_script prolog SPANK_HIVEFS=stripe=2 FAKE_START_RC=3
expect "prolog: failed start -> cleanup over all nodes, exit 1" 1 \
	"$START --stripe=2 $TAIL
ond stop --nodes n1,n2,n3 --name job42 --delete-data --timeout 2"
run_script prolog SPANK_HIVEFS=stripe=2 SLURM_JOB_ID=x1
expect "prolog: bad job id" 1 ""
grep -q "ond start --nodes n1,n2,n3 --name job42" "$T/log" && ok "prolog: log names the command" || bad "prolog: nothing logged"

# -- epilog -------------------------------------------------------------------
STOP="ond stop --local --name job42 --delete-data --timeout 2"
run_script epilog
expect "epilog: no --hivefs, nothing done" 0 ""
mkdir -p "$D/sub"
run_script epilog SPANK_HIVEFS=default
expect "epilog: stop --local; data left by it removed" 0 "$STOP"
[ -e "$D" ] && bad "epilog: data left" || ok "epilog: data removed"
mkdir -p "$D"
chattr +i "$D" 2>/dev/null && {
	touch "$D/x" 2>/dev/null
	run_script epilog SPANK_HIVEFS=default
	chattr -i "$D"
	expect "epilog: data that cannot be removed -> exit 1 (drain)" 1 "$STOP"
}
rm -rf "$D"

if [ "$(id -u)" = 0 ] && command -v unshare >/dev/null; then
	# A mount left at the mount point, a service still running from the data
	# directory, and an `ond stop` that hangs: all inside a private mount
	# namespace.
	mkdir -p "$M" "$D"
	t0=$SECONDS
	unshare --mount --propagation private /bin/bash -c '
		mount -t tmpfs hivefs-test "$1" || exit 9
		setsid bash -c "while :; do sleep 1; done" hivefs-test-service --data="$2" </dev/null >/dev/null 2>&1 &
		svc=$!
		disown
		: >"$3/calls"
		env -i SLURM_JOB_ID=42 SLURMD_NODENAME=n1 SPANK_HIVEFS=default FAKE_STOP_SLEEP=60 \
			HIVEFS_SLURM_CONF="$3/conf" /bin/bash "$4/epilog" >"$3/out" 2>&1
		rc=$?
		awk -v p="$1" "\$5 == p { exit 1 }" /proc/self/mountinfo || rc=$((rc + 100))
		kill -0 $svc 2>/dev/null && { rc=$((rc + 200)); kill $svc; }
		exit $rc' _ "$M" "$D" "$T" "$DIST"
	RC=$?
	took=$((SECONDS - t0))
	CALLS=$(cat "$T/calls")
	expect "epilog: hung ond stop killed, mount detached, service killed" 0 "$STOP"
	[ $took -le 8 ] && ok "epilog: bounded ($took s)" || bad "epilog: took $took s"
	grep -q "lazy unmount of $M" "$T/log" && ok "epilog: lazy unmount logged" || bad "epilog: no lazy unmount logged"
	grep -q "killing leftover processes of $D" "$T/log" && ok "epilog: leftover kill logged" || bad "epilog: no leftover kill logged"
	[ -e "$D" ] && bad "epilog: data left" || ok "epilog: data removed after the hung stop"
else
	SKIP=$((SKIP + 5))
	echo "skip: epilog last-resort cases (need root and unshare)"
fi

echo "$PASS passed, $FAIL failed, $SKIP skipped"
[ $FAIL = 0 ]
