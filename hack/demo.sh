#!/usr/bin/env bash
# Boots the demo VM through containerd with its serial console on this
# terminal. Run by `make demo` after the shim is installed and the guest
# images are built.
#
# It starts a containerd of its own (Debian's 1.6) with the kvm runtime
# registered, so a containerd already running on the node is not touched,
# and stops it again on exit. With a terminal you get the guest's shell:
# type `poweroff` there (or `ctr -a $SOCK task kill demo` from another
# terminal for an ACPI power-off). Without one, the demo waits for the
# guest to reach userspace, powers it off by ACPI and shows the exit status.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DIR=${DEMO_DIR:-/run/kvm-shim-demo}
SOCK=$DIR/containerd.sock
IMAGE=localhost/kvm-guest/kernel:latest
IMAGE_TAR=$ROOT/_output/images/kernel.tar

log() { printf '\033[1mdemo:\033[0m %s\n' "$*" >&2; }

[ "$(id -u)" -eq 0 ] || { log "must run as root"; exit 1; }
command -v containerd-shim-kvm-v1 >/dev/null || { log "containerd-shim-kvm-v1 is not installed (make install)"; exit 1; }

mkdir -p "$DIR"
cat >"$DIR/config.toml" <<TOML
version = 2
root = "$DIR/root"
state = "$DIR/state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "$SOCK"
TOML

containerd_pid=
cleanup() {
	if [ -n "$containerd_pid" ]; then
		ctr -a "$SOCK" task kill -s KILL demo >/dev/null 2>&1 || true
		ctr -a "$SOCK" task delete demo >/dev/null 2>&1 || true
		ctr -a "$SOCK" container delete demo >/dev/null 2>&1 || true
		kill "$containerd_pid" 2>/dev/null || true
		wait "$containerd_pid" 2>/dev/null || true
	fi
}
trap cleanup EXIT

log "starting containerd $(containerd --version | awk '{print $3}') on $SOCK (log: $DIR/containerd.log)"
containerd ${DEMO_CONTAINERD_ARGS:-} --config "$DIR/config.toml" >"$DIR/containerd.log" 2>&1 &
containerd_pid=$!
for _ in $(seq 50); do ctr -a "$SOCK" version >/dev/null 2>&1 && break; sleep 0.2; done
ctr -a "$SOCK" version >/dev/null

log "importing $IMAGE"
ctr -a "$SOCK" images import "$IMAGE_TAR" >/dev/null
containerd-shim-kvm-v1 check || true

run=(ctr -a "$SOCK" run --rm --runtime io.containerd.kvm.v1)
if [ -t 0 ] && [ -t 1 ]; then
	log "booting the VM; its serial console follows. Type 'poweroff' in the guest to end the demo."
	"${run[@]}" -t "$IMAGE" demo
	exit 0
fi

log "booting the VM (no terminal: it is powered off by ACPI once it reaches userspace)"
out=$DIR/console.out
start=$(date +%s.%N)
"${run[@]}" "$IMAGE" demo >"$out" 2>&1 &
runner=$!
until grep -q KVM-GUEST-READY "$out" 2>/dev/null; do
	kill -0 "$runner" 2>/dev/null || { cat "$out"; log "ctr run ended before the guest was up"; exit 1; }
	sleep 0.2
done
ready=$(date +%s.%N)
cat "$out"
log "guest reached userspace $(awk -v a="$start" -v b="$ready" 'BEGIN{printf "%.1f", b-a}') s after ctr run"
log "ctr task kill demo (SIGTERM: ACPI power button)"
ctr -a "$SOCK" task kill demo
status=0
wait "$runner" || status=$?
tail -n 3 "$out"
log "ctr run exited with status $status"
[ "$status" -eq 0 ]
