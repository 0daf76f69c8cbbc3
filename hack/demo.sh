#!/usr/bin/env bash
# Boots the demo VM through containerd with its serial console on this
# terminal. Run by `make demo` after the shim is installed and the guest
# images are built.
#
# It starts a containerd of its own (Debian's 1.6) with the kvm runtime
# registered, so a containerd already running on the node is not touched,
# and stops it again on exit. With a terminal you get the guest's shell:
# type `poweroff` there to end the demo (`reboot` restarts the guest in the
# same VM; `ctr -a $SOCK task kill demo` from another terminal is an ACPI
# power-off). Without one, the demo waits for the guest to reach userspace,
# powers it off by ACPI and shows the exit status.
#
# Whatever an earlier demo left (its containerd, the demo task and its VM,
# the container and its snapshot, mounts below the demo dir) is removed
# first, and said. On Ctrl-C (before the console: on the console it is the
# guest's), a closed terminal (SIGHUP) or `kill` (SIGTERM), the demo removes
# its task, VM, container and containerd before it exits.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DIR=${DEMO_DIR:-/run/kvm-shim-demo}
SOCK=$DIR/containerd.sock
CONFIG=$DIR/config.toml
LOG=$DIR/demo.log
NAME=demo
IMAGE=localhost/kvm-guest/kernel:latest
IMAGE_TAR=$ROOT/_output/images/kernel.tar

# log prints to the terminal and keeps a copy in $LOG: after a closed
# terminal, the cleanup's lines are still somewhere to read.
log() {
	printf '%s demo: %s\n' "$(date +%T)" "$*" >>"$LOG" 2>/dev/null || true
	printf '\033[1mdemo:\033[0m %s\n' "$*" >&2 2>/dev/null || true
}

[ "$(id -u)" -eq 0 ] || { log "must run as root"; exit 1; }
command -v containerd-shim-kvm-v1 >/dev/null || { log "containerd-shim-kvm-v1 is not installed (make install)"; exit 1; }

ctrd() { ctr -a "$SOCK" "$@"; }

# demo_containerds prints the pids of containerd processes started with this
# demo's config (by an earlier demo or this one).
demo_containerds() {
	local p args
	for p in /proc/[0-9]*; do
		args=$(tr '\0' '\n' 2>/dev/null <"$p/cmdline") || continue
		[ "$(basename "$(head -n 1 <<<"$args")")" = containerd ] || continue
		grep -qxF -- "$CONFIG" <<<"$args" && echo "${p#/proc/}"
	done
	return 0
}

# demo_shims prints the pids of kvm shims serving this demo's containerd.
demo_shims() {
	local p args
	for p in /proc/[0-9]*; do
		args=$(tr '\0' '\n' 2>/dev/null <"$p/cmdline") || continue
		[ "$(basename "$(head -n 1 <<<"$args")")" = containerd-shim-kvm-v1 ] || continue
		grep -qxF -- "$SOCK" <<<"$args" && echo "${p#/proc/}"
	done
	return 0
}

# remove_demo removes the demo's task (its VM), container and snapshot from
# the containerd on $SOCK, saying what it found. WHY names the occasion.
remove_demo() {
	local why=$1
	if ctrd tasks ls -q 2>/dev/null | grep -qx "$NAME"; then
		log "$why: removing the task '$NAME' and its VM"
		ctrd tasks kill -s KILL "$NAME" >/dev/null 2>&1 || true
		for _ in $(seq 50); do
			ctrd tasks delete "$NAME" >/dev/null 2>&1 && break
			sleep 0.2
		done
	fi
	if ctrd containers ls -q 2>/dev/null | grep -qx "$NAME"; then
		log "$why: removing the container '$NAME'"
		ctrd containers delete "$NAME" >/dev/null 2>&1 || true
	fi
	if ctrd snapshots ls 2>/dev/null | awk 'NR > 1 {print $1}' | grep -qx "$NAME"; then
		log "$why: removing the snapshot '$NAME'"
		ctrd snapshots rm "$NAME" >/dev/null 2>&1 || true
	fi
}

# stop_pid ends a process: SIGTERM, then SIGKILL after 10 s.
stop_pid() {
	local pid=$1
	kill "$pid" 2>/dev/null || return 0
	for _ in $(seq 50); do
		kill -0 "$pid" 2>/dev/null || return 0
		sleep 0.2
	done
	kill -KILL "$pid" 2>/dev/null || true
}

# unmount_below unmounts whatever is mounted below the demo dir (a rootfs a
# killed containerd left), deepest first.
unmount_below() {
	local why=$1 m
	while read -r m; do
		log "$why: unmounting $m"
		umount -l "$m" 2>/dev/null || true
	done < <(awk -v d="$DIR/" 'index($5, d) == 1 {print $5}' /proc/self/mountinfo | sort -r)
}

# stop_demo_containerds stops every containerd of this demo, after taking
# the demo task and container out of it, then the shims it left.
stop_demo_containerds() {
	local why=$1 pid
	for pid in $(demo_containerds); do
		[ "$pid" = "${containerd_pid:-}" ] || log "$why: found the containerd of an earlier demo (pid $pid)"
		remove_demo "$why"
		log "$why: stopping containerd (pid $pid)"
		stop_pid "$pid"
	done
	for pid in $(demo_shims); do
		log "$why: stopping a shim left behind (pid $pid)"
		stop_pid "$pid"
	done
}

start_containerd() {
	mkdir -p "$DIR"
	cat >"$CONFIG" <<TOML
version = 2
root = "$DIR/root"
state = "$DIR/state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "$SOCK"
TOML
	log "starting containerd $(containerd --version | awk '{print $3}') on $SOCK (log: $DIR/containerd.log)"
	# A session of its own: the terminal's signals (Ctrl-C, the hangup of a
	# closed terminal) reach the demo, which stops containerd in order,
	# after the VM; not containerd first.
	setsid containerd ${DEMO_CONTAINERD_ARGS:-} --config "$CONFIG" >"$DIR/containerd.log" 2>&1 </dev/null &
	containerd_pid=$!
	for _ in $(seq 50); do ctrd version >/dev/null 2>&1 && return 0; sleep 0.2; done
	ctrd version >/dev/null
}

containerd_pid=
runner=
cleaned=
cleanup() {
	local status=$?
	set +e
	[ -z "$cleaned" ] || return 0
	cleaned=1
	trap '' INT TERM HUP
	if [ -n "$containerd_pid" ]; then
		remove_demo "ending the demo"
		# ctr run ends by itself once its task is gone, and puts the
		# terminal back as it found it; it is killed only if it does not.
		if [ -n "$runner" ]; then
			for _ in $(seq 50); do
				kill -0 "$runner" 2>/dev/null || break
				sleep 0.2
			done
			kill "$runner" 2>/dev/null
			wait "$runner" 2>/dev/null
		fi
		stop_demo_containerds "ending the demo"
	fi
	unmount_below "ending the demo"
	[ ! -t 0 ] || stty sane 2>/dev/null
	exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

mkdir -p "$DIR"
: >"$LOG"
# An earlier demo that was killed (or whose machine lost power) may have
# left its containerd running, its task and VM, its container and snapshot
# in containerd's root, or a rootfs mount: start from nothing.
stop_demo_containerds "an earlier demo left this"
unmount_below "an earlier demo left this"
start_containerd
remove_demo "an earlier demo left this"

log "importing $IMAGE"
ctrd images import "$IMAGE_TAR" >/dev/null
containerd-shim-kvm-v1 check || true

run=(ctr -a "$SOCK" run --rm --runtime io.containerd.kvm.v1)
if [ -t 0 ] && [ -t 1 ]; then
	log "booting the VM; its serial console follows. Type 'poweroff' in the guest to end the demo."
	# In the background, with the terminal as its input, so that this shell
	# is in `wait` and acts on a signal at once; the ctr client puts the
	# terminal in raw mode, so Ctrl-C from here on goes to the guest.
	"${run[@]}" -t "$IMAGE" "$NAME" <&0 &
	runner=$!
	status=0
	wait "$runner" || status=$?
	runner=
	log "the VM ended; ctr run exited with status $status"
	exit "$status"
fi

log "booting the VM (no terminal: it is powered off by ACPI once it reaches userspace)"
out=$DIR/console.out
start=$(date +%s.%N)
"${run[@]}" "$IMAGE" "$NAME" >"$out" 2>&1 &
runner=$!
until grep -q KVM-GUEST-READY "$out" 2>/dev/null; do
	kill -0 "$runner" 2>/dev/null || { cat "$out"; log "ctr run ended before the guest was up"; exit 1; }
	sleep 0.2
done
ready=$(date +%s.%N)
cat "$out"
log "guest reached userspace $(awk -v a="$start" -v b="$ready" 'BEGIN{printf "%.1f", b-a}') s after ctr run"
log "ctr task kill $NAME (SIGTERM: ACPI power button)"
ctrd tasks kill "$NAME"
status=0
wait "$runner" || status=$?
runner=
tail -n 3 "$out"
log "ctr run exited with status $status"
[ "$status" -eq 0 ]
