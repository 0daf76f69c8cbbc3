#!/usr/bin/env bash
# Builds a small Debian 12 guest disk with cloud-init, for proving that an
# unchanged "OpenStack style" image boots as a pod and takes its hostname,
# SSH keys, network and user-data from the shim's config drive.
#
#   _output/images/cloud.tar   localhost/kvm-guest/cloud:latest   /disk/cloud.qcow2
#
# The disk: MBR (syslinux mbr.bin), partition 1 FAT16 (active) with syslinux,
# the Debian cloud kernel and its initramfs; partition 2 ext4 root made with
# `mkfs.ext4 -d` from a debootstrap (minbase) tree. No loop device, no mount
# of the image (only /proc inside a private mount namespace while the
# initramfs is regenerated in the chroot). See hack/cloudimage/README.md.
#
# Usage: hack/cloudimage/build.sh     (as root; rebuilds only when this script,
#                                      the mirror or the package list changed)
# Environment:
#   DEBIAN_MIRROR   mirror for debootstrap (default: the first bookworm main
#                   source in the host's apt configuration; none is an error)
#   CLOUDIMAGE_OUT  archive to write (default _output/images/cloud.tar)
#   CLOUDIMAGE_WORK scratch directory (default _output/cloudimage)
#
# Host packages (installed here when missing): debootstrap dosfstools mtools
# syslinux syslinux-common qemu-utils e2fsprogs fdisk; plus Go for hack/ocipack.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
SELF=hack/cloudimage/build.sh
OUT=${CLOUDIMAGE_OUT:-_output/images/cloud.tar}
WORK=${CLOUDIMAGE_WORK:-_output/cloudimage}
SUITE=bookworm
IMAGE_NAME=localhost/kvm-guest/cloud:latest

log() { printf 'cloudimage: %s\n' "$*" >&2; }
die() {
	log "error: $*"
	exit 1
}
# shellcheck source=hack/lib/host-packages.sh
source hack/lib/host-packages.sh
# shellcheck source=hack/lib/apt-mirror.sh
source hack/lib/apt-mirror.sh

[[ $(id -u) == 0 ]] || die "must run as root (debootstrap and chroot)"

# --- mirror -----------------------------------------------------------------

# The mirror is the host's own: this tree names none (hack/lib/apt-mirror.sh).
# Checked before anything is installed.
if [[ -n ${DEBIAN_MIRROR:-} ]]; then
	MIRROR=$DEBIAN_MIRROR
elif ! MIRROR=$(apt_mirror "$SUITE"); then
	die "no Debian mirror: the host's apt sources (/etc/apt/sources.list, /etc/apt/sources.list.d/*.list and *.sources) have no enabled \"deb\" entry for $SUITE main with an http, https or file URI; add one, or set DEBIAN_MIRROR"
fi
MIRROR=${MIRROR%/}

# --- host packages ----------------------------------------------------------

# shellcheck disable=SC2034 # read by install_missing through a nameref
declare -A NEED=(
	[debootstrap]=debootstrap
	[mkfs.vfat]=dosfstools
	[mcopy]=mtools
	[syslinux]=syslinux
	[/usr/lib/syslinux/mbr/mbr.bin]=syslinux-common
	[qemu-img]=qemu-utils
	[mkfs.ext4]=e2fsprogs
	[sfdisk]=fdisk
)
install_missing NEED
command -v go >/dev/null || die "go is not installed (needed for hack/ocipack)"

# --- what goes into the guest -----------------------------------------------

# Packages on top of minbase. cloud-init brings python3 and its modules;
# systemd-resolved makes the DNS servers from network_data.json effective;
# iproute2 is needed by cloud-init's networkd renderer; openssh-server so the
# injected keys are usable as in any cloud image; qemu-guest-agent for exec
# (udev starts its service when the agent's virtio-serial port appears).
PACKAGES=(
	systemd-sysv udev kmod
	linux-image-cloud-amd64 initramfs-tools
	cloud-init systemd-resolved iproute2
	openssh-server qemu-guest-agent
	# debootstrap does not resolve virtual packages: name their providers.
	dbus python3-cffi-backend
)
# Modules in the initramfs (MODULES=list: only these and their dependencies):
# the root disk (virtio_blk on virtio_pci, or virtio-scsi), ext4, and vfat
# for the config drive.
INITRAMFS_MODULES=(
	virtio_pci virtio_blk virtio_scsi sd_mod virtio_net
	ext4 crc32c_generic
	fat vfat nls_cp437 nls_ascii iso9660
)
CMDLINE_EXTRA="console=ttyS0,115200 quiet"

ROOT_UUID=4b564d43-4c4f-5544-8000-000000000002 # fixed, so the image is stable
DISK_ID=0x4b564d43
DISK_SIZE_MIB=2048 # virtual size; qcow2 stores only what is used
BOOT_START=2048    # sectors (1 MiB)

# The stamp names everything the root tree depends on.
STAMP_TEXT=$(printf '%s\n' "$MIRROR" "$SUITE" "${PACKAGES[*]}" "${INITRAMFS_MODULES[*]}" && sha256sum "$SELF" | cut -d' ' -f1)

mkdir -p "$WORK" "$(dirname "$OUT")"
WORK=$(cd "$WORK" && pwd)
QCOW=$WORK/cloud.qcow2
STAMP=$WORK/cloud.qcow2.stamp

build_disk() {
	local t0=$SECONDS
	local R=$WORK/rootfs D=$WORK/disk
	rm -rf "$R" "$D"
	mkdir -p "$R" "$D" "$WORK/debs"

	# -- root tree -----------------------------------------------------------
	# No service may start inside the chroot (sshd would, on the host's
	# network): policy-rc.d says no until the tree is done.
	install -D -m 0755 /dev/stdin "$R/usr/sbin/policy-rc.d" <<'EOF'
#!/bin/sh
exit 101
EOF
	log "debootstrap $SUITE from $MIRROR (minbase + ${PACKAGES[*]})"
	debootstrap --variant=minbase --cache-dir="$WORK/debs" \
		--include="$(
			IFS=,
			echo "${PACKAGES[*]}"
		)" \
		"$SUITE" "$R" "$MIRROR" >"$WORK/debootstrap.log" 2>&1 ||
		{
			tail -n 30 "$WORK/debootstrap.log" >&2
			die "debootstrap failed (log: $WORK/debootstrap.log)"
		}
	log "debootstrap done in $((SECONDS - t0)) s"

	# cloud-init: only the config drive (and None as the fallback, so a boot
	# without a drive still finishes), networkd for the network config.
	# Host keys: ed25519 only, RSA key generation is slow under TCG.
	install -D -m 0644 /dev/stdin "$R/etc/cloud/cloud.cfg.d/90-kvm-shim.cfg" <<'EOF'
# hack/cloudimage: config-drive only guest for containerd-shim-kvm-v1 tests.
datasource_list: [ ConfigDrive, None ]
ssh_genkeytypes: [ ed25519 ]
# C.UTF-8 needs no locale-gen (slow under TCG, and the sources are trimmed).
locale: C.UTF-8
system_info:
  network:
    renderers: [ networkd ]
    activators: [ networkd ]
EOF
	# The network is static and local: do not hold boot for two minutes
	# waiting for "online".
	install -D -m 0644 /dev/stdin "$R/etc/systemd/system/systemd-networkd-wait-online.service.d/timeout.conf" <<'EOF'
[Service]
ExecStart=
ExecStart=/lib/systemd/systemd-networkd-wait-online --any --timeout=20
EOF
	chroot "$R" systemctl enable systemd-networkd.service systemd-resolved.service >/dev/null 2>&1
	# Timers and jobs that only cost time in a short-lived test guest.
	chroot "$R" systemctl mask apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer \
		e2scrub_reap.service fstrim.timer >/dev/null 2>&1 || true

	printf 'UUID=%s / ext4 defaults,errors=remount-ro 0 1\n' "$ROOT_UUID" >"$R/etc/fstab"
	printf 'debian\n' >"$R/etc/hostname"
	printf '127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n' >"$R/etc/hosts"
	# A fresh machine-id on first boot (cloud-init treats the VM as new).
	: >"$R/etc/machine-id"
	rm -f "$R/var/lib/dbus/machine-id"
	# Host keys are made per instance by cloud-init.
	rm -f "$R"/etc/ssh/ssh_host_*

	# -- initramfs -------------------------------------------------------------
	printf 'MODULES=list\nCOMPRESS=gzip\n' >"$R/etc/initramfs-tools/conf.d/kvm-shim.conf"
	printf '%s\n' "${INITRAMFS_MODULES[@]}" >"$R/etc/initramfs-tools/modules"
	local kver
	kver=$(basename "$(find "$R/lib/modules" -mindepth 1 -maxdepth 1 -type d | sort -V | tail -n 1)")
	[[ -n $kver && -e $R/boot/vmlinuz-$kver ]] || die "no kernel in the root tree"
	log "initramfs for $kver"
	rm -f "$R/boot/initrd.img-$kver"
	unshare --mount --propagation private chroot "$R" /bin/sh -ec \
		'mount -t proc proc /proc; update-initramfs -c -k "$1" >/dev/null; umount /proc' sh "$kver"
	[[ -s $R/boot/initrd.img-$kver ]] || die "update-initramfs wrote nothing"

	# Kernel and initramfs live on the boot partition only.
	mv "$R/boot/vmlinuz-$kver" "$D/vmlinuz"
	mv "$R/boot/initrd.img-$kver" "$D/initrd.img"
	rm -f "$R"/boot/System.map-* "$R"/boot/config-* "$R/vmlinuz" "$R/initrd.img" "$R/vmlinuz.old" "$R/initrd.img.old"

	# -- trim --------------------------------------------------------------------
	rm -f "$R/usr/sbin/policy-rc.d"
	# Kernel modules a VM on virtio never loads (a third of the image):
	# other NICs, InfiniBand, network and cluster file systems, KVM itself.
	local m=$R/lib/modules/$kver/kernel
	rm -rf "$m/drivers/net/ethernet" "$m/drivers/infiniband" "$m/drivers/comedi" "$m/drivers/target" \
		"$m/drivers/md/bcache" "$m/drivers/block/drbd" "$m/arch/x86/kvm" \
		"$m/fs/xfs" "$m/fs/btrfs" "$m/fs/smb" "$m/fs/nfs" "$m/fs/nfsd" "$m/fs/ceph" "$m/fs/ocfs2" "$m/fs/gfs2" \
		"$m/net/ceph" "$m/net/sunrpc" "$m/net/tipc" "$m/net/sctp" "$m/net/netfilter/ipvs" "$m/net/rds"
	chroot "$R" depmod -a "$kver"
	# Only C.UTF-8 is used (see 90-kvm-shim.cfg): drop locale sources.
	rm -rf "$R"/usr/share/i18n/charmaps/* "$R"/usr/share/i18n/locales/*
	chroot "$R" apt-get clean
	rm -rf "$R"/var/lib/apt/lists/* "$R"/var/cache/apt/*.bin "$R"/var/cache/debconf/*-old \
		"$R"/usr/share/doc/* "$R"/usr/share/man/* "$R"/usr/share/info/* \
		"$R"/var/log/* "$R"/tmp/* "$R"/var/tmp/*
	find "$R/usr/share/locale" -mindepth 1 -maxdepth 1 ! -name locale.alias -exec rm -rf {} +

	# -- boot partition (FAT16, syslinux) ------------------------------------------
	cat >"$D/syslinux.cfg" <<EOF
SERIAL 0 115200
PROMPT 0
TIMEOUT 0
DEFAULT debian
LABEL debian
  LINUX /vmlinuz
  INITRD /initrd.img
  APPEND root=UUID=$ROOT_UUID ro $CMDLINE_EXTRA
EOF
	local boot_kib boot_mib boot_sectors root_start root_sectors
	boot_kib=$((($(stat -c %s "$D/vmlinuz") + $(stat -c %s "$D/initrd.img")) / 1024))
	boot_mib=$((boot_kib / 1024 + 8))
	boot_sectors=$((boot_mib * 2048))
	root_start=$((BOOT_START + boot_sectors))
	root_sectors=$((DISK_SIZE_MIB * 2048 - root_start))
	truncate -s "${boot_mib}M" "$D/boot.img"
	mkfs.vfat -F 16 -n BOOT -h "$BOOT_START" "$D/boot.img" >/dev/null
	syslinux --install "$D/boot.img"
	MTOOLS_SKIP_CHECK=1 mcopy -i "$D/boot.img" "$D/vmlinuz" "$D/initrd.img" "$D/syslinux.cfg" ::

	# -- disk ------------------------------------------------------------------------
	truncate -s "${DISK_SIZE_MIB}M" "$D/disk.raw"
	sfdisk -q "$D/disk.raw" <<EOF
label: dos
label-id: $DISK_ID
start=$BOOT_START, size=$boot_sectors, type=e, bootable
start=$root_start, size=$root_sectors, type=83
EOF
	dd if=/usr/lib/syslinux/mbr/mbr.bin of="$D/disk.raw" bs=440 count=1 conv=notrunc status=none
	dd if="$D/boot.img" of="$D/disk.raw" bs=512 seek="$BOOT_START" conv=notrunc,sparse status=none
	# The root file system is written straight into the partition.
	mkfs.ext4 -q -F -L cloudroot -U "$ROOT_UUID" -d "$R" -E "offset=$((root_start * 512)),root_owner=0:0" \
		"$D/disk.raw" "$((root_sectors / 2))k"

	log "qcow2 (compressed)"
	qemu-img convert -c -f raw -O qcow2 "$D/disk.raw" "$QCOW.new"
	mv -f "$QCOW.new" "$QCOW"
	printf '%s\n' "$kver" >"$WORK/kernel.version"
	rm -rf "$D" "$R"
	log "disk built in $((SECONDS - t0)) s: $(du -h "$QCOW" | cut -f1) (qcow2), root tree was the rest"
}

if [[ ! -s $QCOW || ! -e $STAMP || $(cat "$STAMP") != "$STAMP_TEXT" ]]; then
	rm -f "$STAMP"
	build_disk
	printf '%s\n' "$STAMP_TEXT" >"$STAMP"
else
	log "disk up to date: $QCOW"
fi

# --- OCI archive ----------------------------------------------------------------

if [[ ! -e $OUT || $QCOW -nt $OUT || $SELF -nt $OUT ]]; then
	log "packing $IMAGE_NAME -> $OUT"
	GOWORK=off go run -mod=mod ./hack/ocipack -name "$IMAGE_NAME" -out "$OUT.new" \
		-cmd /vm -file "/disk/cloud.qcow2=$QCOW:0644"
	mv -f "$OUT.new" "$OUT"
fi
log "$OUT: $(du -h "$OUT" | cut -f1)"
