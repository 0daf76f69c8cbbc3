#!/usr/bin/env bash
# Prepare this host for building and testing containerd-shim-kvm-v1:
# install the Debian packages, start virtlogd and libvirtd (no systemd here),
# and build containerd 2.x (with its runc shim) for the integration tests'
# second flavour.
#
# Idempotent and quiet when everything is already in place: it then prints
# only the final one-line version summary.
#
# Environment:
#   EXTRA_PACKAGES      more Debian packages to install (space separated)
#   CONTAINERD2_VERSION containerd 2.x version to build (default v2.2.1)
#   SETUP_CONTAINERD2   0 skips building containerd 2.x (the demo runs
#                       Debian's 1.6 only); default 1
#   LIBVIRT_URI         libvirt URI to check (default qemu:///system)
#
# `hack/setup-host.sh containerd2` builds containerd 2.x only (make test
# starts it in the background, hack/tiers.sh): nothing but Go is needed.
#
# containerd itself is not started: the integration tests run their own
# private instances.
set -euo pipefail

PACKAGES=(
	containerd runc
	libvirt-daemon-system libvirt-clients qemu-system-x86 qemu-utils
	linux-image-cloud-amd64 busybox-static dosfstools mtools syslinux syslinux-common cpio
	containernetworking-plugins iproute2 ethtool
	libxml2-utils genisoimage ipxe
	cloud-init debootstrap e2fsprogs fdisk iperf3 qemu-guest-agent
	etcd-server iptables conntrack
	tmux lintian
)
# shellcheck disable=SC2206 # word splitting of the list is intended
PACKAGES+=(${EXTRA_PACKAGES:-})

CONTAINERD2_VERSION=${CONTAINERD2_VERSION:-v2.2.1}
CONTAINERD2_BIN=/usr/local/lib/kvm-shim/containerd-${CONTAINERD2_VERSION}/bin
LIBVIRT_URI=${LIBVIRT_URI:-qemu:///system}

log() { echo "setup-host: $*" >&2; }
die() {
	log "error: $*"
	exit 1
}

[ "$(id -u)" -eq 0 ] || die "must run as root"

missing_packages() {
	local p status
	for p in "${PACKAGES[@]}"; do
		status=$(dpkg-query -W -f='${db:Status-Abbrev}' "$p" 2>/dev/null || true)
		[ "${status:0:2}" = "ii" ] || echo "$p"
	done
}

install_packages() {
	local missing
	mapfile -t missing < <(missing_packages)
	[ "${#missing[@]}" -gt 0 ] || return 0
	# Refresh the package lists only when they are missing or older than a day.
	if [ -z "$(find /var/lib/apt/lists -maxdepth 1 -name '*_Packages*' -mtime -1 -print -quit 2>/dev/null)" ]; then
		log "apt-get update"
		DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
	fi
	log "installing: ${missing[*]}"
	apt_install "${missing[@]}"
}

# apt_install PKG...: apt-get install, tried up to three times. Some images
# (Debian's docker-clean apt configuration) delete downloaded archives after
# every dpkg run, so an install that needs several dpkg runs fails halfway
# with "cannot access archive"; the next run fetches what is left.
apt_install() {
	local try
	for try in 1 2 3; do
		if DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/tmp/setup-host-apt.log 2>&1; then
			return 0
		fi
		log "apt-get install failed (try $try of 3): $(grep -E '^E:' /tmp/setup-host-apt.log | head -n 3 | tr '\n' ' ')"
	done
	cat /tmp/setup-host-apt.log >&2
	die "apt-get install failed three times"
}

# start_daemon NAME: run /usr/sbin/NAME -d unless a NAME process is alive.
start_daemon() {
	local name=$1 pidfile=/run/$1.pid
	if [ -s "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
		return 0
	fi
	if pgrep -x "$name" >/dev/null; then
		return 0
	fi
	log "starting $name"
	"/usr/sbin/$name" -d
}

wait_libvirt() {
	local deadline=$((SECONDS + 60))
	until virsh -c "$LIBVIRT_URI" version >/dev/null 2>&1; do
		[ "$SECONDS" -lt "$deadline" ] || die "libvirtd did not answer on $LIBVIRT_URI within 60s"
		sleep 0.5
	done
	# Read the whole answer first: grep -q stops at the first match, and
	# under pipefail virsh's SIGPIPE on the rest would fail the check.
	local caps
	caps=$(virsh -c "$LIBVIRT_URI" capabilities) || die "virsh capabilities on $LIBVIRT_URI failed"
	grep -q "<domain type='qemu'" <<<"$caps" ||
		die "libvirt capabilities on $LIBVIRT_URI show no qemu domain type"
}

# libvirt must leave the controllers that charge a VM to its pod (memory,
# cpu, cpuacct, pids) to the shim, which moves QEMU into the container's
# cgroup; with them on, libvirt moves vCPU threads into its own groups.
# cgroup v1 keeps cpuset (numatune's binding), devices and blkio with
# libvirt; cgroup v2 has one hierarchy, so libvirt manages none there (as
# KubeVirt does; numatune then binds through the memory policy).
QEMU_CONF=/etc/libvirt/qemu.conf
LIBVIRT_CGROUPS_MARK="# containerd-shim-kvm-v1: libvirt leaves memory, cpu, cpuacct and pids to the shim"
libvirt_cgroup_line() {
	if [ "$(stat -fc %T /sys/fs/cgroup)" = cgroup2fs ]; then
		echo 'cgroup_controllers = [ ]'
	else
		echo 'cgroup_controllers = [ "cpuset", "devices", "blkio" ]'
	fi
}

# configure_libvirt_cgroups: sets cgroup_controllers in qemu.conf; prints
# "changed" when it did.
configure_libvirt_cgroups() {
	local want
	want=$(libvirt_cgroup_line)
	[ -f "$QEMU_CONF" ] || die "$QEMU_CONF is missing (libvirt-daemon-system not installed?)"
	if grep -qxF "$want" "$QEMU_CONF" && [ "$(grep -c '^[[:space:]]*cgroup_controllers' "$QEMU_CONF")" = 1 ]; then
		return 0
	fi
	log "setting $want in $QEMU_CONF"
	sed -i -e '/^[[:space:]]*cgroup_controllers/d' -e "/^$LIBVIRT_CGROUPS_MARK\$/d" "$QEMU_CONF"
	printf '%s\n%s\n' "$LIBVIRT_CGROUPS_MARK" "$want" >>"$QEMU_CONF"
	echo changed
}

# restart_libvirtd: restarts the libvirtd this script started (its pid
# file), holding the integration tests' host lock so no test loses its
# libvirtd halfway, and waits until it answers again.
restart_libvirtd() {
	local pid
	if ! { [ -s /run/libvirtd.pid ] && pid=$(cat /run/libvirtd.pid) && kill -0 "$pid" 2>/dev/null; }; then
		if pgrep -x libvirtd >/dev/null; then
			log "warning: a libvirtd this script did not start is running: restart it for the new $QEMU_CONF"
		fi
		return 0
	fi
	log "restarting libvirtd (pid $pid) for the new qemu.conf"
	exec {lockfd}>/run/kvm-shim-integration.lock
	flock "$lockfd"
	kill "$pid"
	local deadline=$((SECONDS + 30))
	while kill -0 "$pid" 2>/dev/null; do
		[ "$SECONDS" -lt "$deadline" ] || die "libvirtd (pid $pid) did not stop within 30s"
		sleep 0.2
	done
	# The daemon must not inherit the lock's descriptor: it would hold the
	# lock for as long as it runs, and every integration run would wait.
	start_daemon libvirtd {lockfd}>&-
	wait_libvirt
	exec {lockfd}>&-
}

# mount_hugetlb_cgroup mounts the cgroup v1 hugetlb controller when the
# kernel has it and nothing mounted it (systemd does; this host has no
# systemd). Without it containerd's CRI drops a container's huge page limits
# with only a warning in its own log (tolerate_missing_hugetlb_controller,
# true by default), so the shim never learns that a pod asked for huge pages
# and backs the VM with ordinary memory.
mount_hugetlb_cgroup() {
	[ "$(stat -fc %T /sys/fs/cgroup)" = cgroup2fs ] && return 0
	awk '$1 == "hugetlb" && $4 == 1 { found = 1 } END { exit !found }' /proc/cgroups || return 0
	awk '$3 == "cgroup" && $4 ~ /(^|,)hugetlb(,|$)/ { found = 1 } END { exit !found }' /proc/mounts && return 0
	log "mounting the hugetlb cgroup controller on /sys/fs/cgroup/hugetlb"
	mkdir -p /sys/fs/cgroup/hugetlb
	mount -t cgroup -o hugetlb cgroup /sys/fs/cgroup/hugetlb
}

# share_netns_dir makes /run/netns a shared mount point of its own before
# any pod runs, as `ip netns add` does the first time it is used. Made
# later, with pods' network namespaces mounted below it, that bind mount
# hides a second copy of each of them that containerd 1.6 can never remove
# (StopPodSandbox fails with EBUSY). The suite's own network tests run
# `ip netns add` while other pods may run, so the mount is made here.
share_netns_dir() {
	mkdir -p /run/netns
	if ! mountpoint -q /run/netns; then
		log "making /run/netns a shared mount point"
		mount --bind /run/netns /run/netns
	fi
	mount --make-shared /run/netns
}

# searchable_libvirt_dirs gives libvirt's per-domain dirs o+x (0751, as
# upstream's packaging has them; Debian's is 0750). Each VM's QEMU runs
# under a uid of its own (vm_id_range) that is not libvirt-qemu, and must
# reach its own domain-N-<name> dir (master key, agent socket) below
# them; those dirs are that uid's alone. The statoverride keeps the mode
# over package upgrades; the shim also restores it when it starts.
searchable_libvirt_dirs() {
	local d
	for d in /var/lib/libvirt/qemu /var/lib/libvirt/qemu/channel /var/lib/libvirt/qemu/channel/target; do
		[ -d "$d" ] || continue
		if ! dpkg-statoverride --list "$d" >/dev/null 2>&1; then
			dpkg-statoverride --update --add libvirt-qemu libvirt-qemu 0751 "$d"
		fi
		chmod o+x "$d"
	done
}

build_containerd2() {
	if [ -x "$CONTAINERD2_BIN/containerd" ] && [ -x "$CONTAINERD2_BIN/ctr" ] &&
		[ -x "$CONTAINERD2_BIN/containerd-shim-runc-v2" ] &&
		"$CONTAINERD2_BIN/containerd" --version | grep -qF " ${CONTAINERD2_VERSION#v}"; then
		return 0
	fi
	command -v go >/dev/null || die "go is needed to build containerd $CONTAINERD2_VERSION"
	log "building containerd $CONTAINERD2_VERSION into $CONTAINERD2_BIN"
	mkdir -p "$CONTAINERD2_BIN"
	# Run outside any module so the project's go.mod does not interfere.
	(cd / && GOBIN=$CONTAINERD2_BIN GOFLAGS=-buildvcs=false go install \
		"github.com/containerd/containerd/v2/cmd/containerd@$CONTAINERD2_VERSION" \
		"github.com/containerd/containerd/v2/cmd/ctr@$CONTAINERD2_VERSION" \
		"github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@$CONTAINERD2_VERSION")
}

if [ "${1:-}" = containerd2 ]; then
	build_containerd2
	exit 0
fi
install_packages
mount_hugetlb_cgroup
share_netns_dir
searchable_libvirt_dirs
cgroups_changed=$(configure_libvirt_cgroups)
start_daemon virtlogd
if [ -n "$cgroups_changed" ]; then
	restart_libvirtd
fi
start_daemon libvirtd
wait_libvirt
containerd2=skipped
if [ "${SETUP_CONTAINERD2:-1}" != 0 ]; then
	build_containerd2
	containerd2=$("$CONTAINERD2_BIN/containerd" --version | awk '{print $3}')
fi

echo "setup-host: ok:" \
	"containerd $(/usr/bin/containerd --version | awk '{print $3}')," \
	"containerd2 $containerd2," \
	"runc $(runc --version | awk 'NR==1{print $3}')," \
	"libvirt $(virsh -c "$LIBVIRT_URI" version | awk '/Using library/{print $4}')," \
	"qemu $(qemu-system-x86_64 --version | awk 'NR==1{print $4}')," \
	"go $(go version 2>/dev/null | awk '{print $3}' || echo none)"
