#!/usr/bin/env bash
# Builds the guest test images for containerd-shim-kvm-v1 into _output/images/
# as OCI image archives for `ctr images import` (see hack/guest/README.md):
#
#   kernel.tar   localhost/kvm-guest/kernel:latest   /boot/vmlinuz + /boot/initrd.img
#   bios.tar     localhost/kvm-guest/bios:latest     /disk/guest.qcow2 (SeaBIOS -> syslinux -> same kernel/initrd)
#   pause.tar    localhost/kvm-guest/pause:latest    /pause, a static "wait for SIGTERM" binary
#   busybox.tar  localhost/kvm-guest/busybox:latest  /bin/busybox (static), a plain container image: no VM in it
#   foreign.tar  localhost/kvm-guest/foreign:latest  /disk/ipxe.img, a disk this repo did not build (see below)
#   nodisk.tar, twodisks.tar, escape.tar, corrupt.tar: bad containerDisk images for negative tests
#
# Foreign image: Debian's "ipxe" package ships /usr/lib/ipxe/ipxe.iso, an
# isohybrid ISO (ISOLINUX + iPXE, built by Debian from upstream iPXE), so it
# boots through SeaBIOS as a plain hard disk on any bus. It was picked over
# grub-rescue-pc (its hybrid ISO reaches the menu, but booted as a hard disk
# the default entry fails: "unknown filesystem"), memtest86+ (draws on VGA
# only, nothing on serial) and debian-installer-*-netboot (130 MB, graphical
# menu that waits forever).
# iPXE prints only through BIOS int 10h, so its lines appear on the serial
# port only when SeaBIOS mirrors the screen there, which SeaBIOS does when
# QEMU runs with graphics off (-nographic / -machine graphics=off, i.e. libvirt
# <os><bios useserial='yes'/></os>). Then ttyS0 shows, in order:
#   "Booting from Hard Disk...", "ISOLINUX 6.04 ...", "iPXE ISO boot image",
#   "iPXE initialising devices...ok", "iPXE 1.0.0+git-20190125.36a4c85-5.1 -- Open Source Network Boot Firmware"
# and then iPXE tries DHCP on every NIC, falls back to the next boot device
# and stops at "No bootable device.". iPXE ignores ACPI shutdown requests.
#
# Usage: hack/guest/build.sh        (no arguments; re-running is cheap: every
#                                    output is rebuilt only when an input changed)
# Environment:
#   KVM_GUEST_KERNEL   kernel image to use (default: newest /boot/vmlinuz-*-cloud-amd64);
#                      its modules must be in /lib/modules/<version>/
#   SOURCE_DATE_EPOCH  timestamp for every file in the images (default 0)
#
# Host packages needed: golang-go (or any Go >= the go.mod version) and
# linux-image-cloud-amd64 must be there; busybox-static dosfstools mtools
# syslinux syslinux-common qemu-utils ipxe are installed here with apt-get
# when missing (as root).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
SELF=hack/guest/build.sh
OUT=_output/images
WORK=_output/guest-build
mkdir -p "$OUT" "$WORK/bin"

log() { printf 'guest-build: %s\n' "$*" >&2; }
die() {
	log "error: $*"
	exit 1
}
# shellcheck source=hack/lib/host-packages.sh
source hack/lib/host-packages.sh

# --- host packages ----------------------------------------------------------

# Probe file (or command) -> Debian package providing it.
# shellcheck disable=SC2034 # read by install_missing through a nameref
declare -A NEED=(
	[/bin/busybox]=busybox-static
	[mkfs.vfat]=dosfstools
	[mcopy]=mtools
	[syslinux]=syslinux
	[/usr/lib/syslinux/mbr/mbr.bin]=syslinux-common
	[qemu-img]=qemu-utils
	[/usr/lib/ipxe/ipxe.iso]=ipxe
	[/usr/sbin/qemu-ga]=qemu-guest-agent
)
install_missing NEED
command -v go >/dev/null || die "go is not installed"
# elf_has_interp FILE: true when the ELF64 FILE has a PT_INTERP program
# header, i.e. needs a dynamic loader.
elf_has_interp() {
	local phoff phentsize phnum i
	phoff=$(od -An -t u8 -j 32 -N 8 "$1" | tr -d ' ')
	phentsize=$(od -An -t u2 -j 54 -N 2 "$1" | tr -d ' ')
	phnum=$(od -An -t u2 -j 56 -N 2 "$1" | tr -d ' ')
	for ((i = 0; i < phnum; i++)); do
		[[ $(od -An -t u4 -j $((phoff + i * phentsize)) -N 4 "$1" | tr -d ' ') == 3 ]] && return 0
	done
	return 1
}
# The Debian "busybox" package also installs a dynamically linked /bin/busybox;
# only busybox-static's works inside the initramfs.
if elf_has_interp /bin/busybox; then
	die "/bin/busybox is dynamically linked; install busybox-static"
fi

# --- helpers ----------------------------------------------------------------

# stale OUT INPUT...: true when OUT is missing or older than any INPUT.
stale() {
	local out=$1 in
	shift
	[[ -e $out ]] || return 0
	for in in "$@"; do
		[[ $in -nt $out ]] && return 0
	done
	return 1
}

# replace NEW DEST: move NEW to DEST unless DEST already has the same bytes,
# so that DEST's mtime only moves when its content does.
replace() {
	if [[ -e $2 ]] && cmp -s "$1" "$2"; then
		rm -f "$1"
	else
		mv -f "$1" "$2"
	fi
}

# write_if_changed DEST: store stdin in DEST via replace.
write_if_changed() {
	cat >"$1.tmp"
	replace "$1.tmp" "$1"
}

# gobuild PKG DEST [extra go build args]: build a tool, keeping DEST's mtime
# when the binary did not change. -mod=mod: these tools use only the
# standard library, whatever the state of the module's other dependencies.
# Skipped while DEST is newer than every file of the package, of
# hack/internal (which the packers share) and go.mod: go build relinks
# every time, five tools took 10 s of a warm run (make demo runs this).
gobuild() {
	local pkg=$1 dest=$2
	shift 2
	if [ -e "$dest" ] && [ -z "$(find "$pkg" hack/internal go.mod -newer "$dest" -print -quit)" ]; then
		return 0
	fi
	GOWORK=off go build -mod=mod -trimpath -ldflags='-s -w -buildid=' "$@" -o "$dest.tmp" "$pkg"
	replace "$dest.tmp" "$dest"
}

# --- tools ------------------------------------------------------------------

OCIPACK=$WORK/bin/ocipack
MKCPIO=$WORK/bin/mkcpio
gobuild ./hack/ocipack "$OCIPACK"
gobuild ./hack/guest/mkcpio "$MKCPIO"
CGO_ENABLED=0 GOOS=linux GOARCH=amd64 gobuild ./hack/guest/pause "$WORK/bin/pause"
CGO_ENABLED=0 GOOS=linux GOARCH=amd64 gobuild ./hack/guest/iobench "$WORK/bin/kvm-guest-iobench"
CGO_ENABLED=0 GOOS=linux GOARCH=amd64 gobuild ./hack/guest/console "$WORK/bin/kvm-guest-console"

# pack NAME OUTFILE OCIPACK-ARGS...: write an image archive unless it is
# newer than the packer, this script and every -file source.
pack() {
	local name=$1 out=$2 src
	shift 2
	local inputs=("$OCIPACK" "$SELF") args=("$@")
	while (($#)); do
		if [[ $1 == -file && $# -ge 2 ]]; then
			src=${2#*=}
			inputs+=("${src%%:*}") # drop the :mode[:uid:gid] suffix
			shift
		fi
		shift
	done
	if stale "$out" "${inputs[@]}"; then
		log "packing $name -> $out"
		"$OCIPACK" -name "$name" -out "$out" "${args[@]}"
	fi
}

# --- kernel and modules -----------------------------------------------------

KERNEL=${KVM_GUEST_KERNEL:-}
if [[ -z $KERNEL ]]; then
	KERNEL=$(find /boot -maxdepth 1 -name 'vmlinuz-*-cloud-amd64' -print | sort -V | tail -n 1)
	[[ -n $KERNEL ]] || die "no /boot/vmlinuz-*-cloud-amd64 (apt-get install linux-image-cloud-amd64)"
fi
[[ -r $KERNEL ]] || die "kernel $KERNEL is not readable"
KVER=${KERNEL##*/vmlinuz-}
MODDIR=/lib/modules/$KVER
[[ -r $MODDIR/modules.dep ]] || die "no $MODDIR/modules.dep for kernel $KERNEL"
printf '%s\n' "$KERNEL" | write_if_changed "$WORK/kernel.ref"

# Modules, in load order. "early" ones are loaded before KVM-GUEST-READY:
# the ACPI power button driver and evdev for its /dev/input/eventN, and
# the driver of the domains' pvpanic device (ACPI QEMU0001 at port 0x505),
# so that a panic from READY on reaches the host.
EARLY_MODULES=(button evdev pvpanic pvpanic-mmio)
LATE_MODULES=(virtio_ring virtio virtio_pci_modern_dev virtio_pci_legacy_dev virtio_pci
	failover net_failover virtio_net virtio_blk virtio_console fat vfat nls_cp437 nls_ascii fuse virtiofs virtio_mem)

# resolve_modules NAME...: append each module to MODULES (load order) with
# its file in MODFILE; skip built-ins; check that every dependency comes
# earlier in the load order.
MODULES=()
declare -A MODFILE=()
resolve_modules() {
	local m line rel dep
	for m in "$@"; do
		if grep -qE "/${m}\.ko(\.[a-z]+)?\$" "$MODDIR/modules.builtin" 2>/dev/null; then
			continue
		fi
		line=$(grep -E "(^|/)${m}\.ko(\.[a-z]+)?:" "$MODDIR/modules.dep" | head -n 1 || true)
		[[ -n $line ]] || die "module $m not found for $KVER"
		rel=${line%%:*}
		[[ $rel == *.ko ]] || die "module $rel is compressed; busybox insmod here needs plain .ko"
		for dep in ${line#*:}; do
			dep=${dep##*/}
			dep=${dep%.ko}
			[[ -n ${MODFILE[$dep]:-} ]] || die "module $m needs $dep loaded before it"
		done
		MODFILE[$m]=$MODDIR/$rel
		MODULES+=("$m")
	done
}
resolve_modules "${EARLY_MODULES[@]}"
EARLY=("${MODULES[@]}")
resolve_modules "${LATE_MODULES[@]}"
LATE=("${MODULES[@]:${#EARLY[@]}}")

# --- initramfs --------------------------------------------------------------

INITRD=$WORK/initrd.img
STAGE=$WORK/initrd-root
rm -rf "$STAGE"
mkdir -p "$STAGE"/{bin,sbin,usr/bin,usr/sbin,proc,sys,dev,tmp,run,root,etc/kvm-guest,"lib/modules/$KVER"}
cp /bin/busybox "$STAGE/bin/busybox"
for applet in $(/bin/busybox --list-full); do
	[[ $applet == bin/busybox ]] && continue
	ln -sf /bin/busybox "$STAGE/$applet"
done
install -m 0755 hack/guest/init "$STAGE/init"
install -m 0755 hack/guest/kvm-guest-probe "$STAGE/bin/kvm-guest-probe"
install -m 0755 hack/guest/kvm-guest-discard "$STAGE/bin/kvm-guest-discard"
install -m 0755 "$WORK/bin/kvm-guest-iobench" "$STAGE/bin/kvm-guest-iobench"
install -m 0755 "$WORK/bin/kvm-guest-console" "$STAGE/bin/kvm-guest-console"
for m in "${MODULES[@]}"; do
	cp "${MODFILE[$m]}" "$STAGE/lib/modules/$KVER/$m.ko"
done
# Debian's QEMU guest agent with the shared libraries it links (the
# initramfs has no others), for exec through the agent.
install -D -m 0755 /usr/sbin/qemu-ga "$STAGE/usr/sbin/qemu-ga"
for lib in $(ldd /usr/sbin/qemu-ga | grep -o '/[^ ]*'); do
	install -D -m 0755 "$(readlink -f "$lib")" "$STAGE$lib"
done
printf '%s\n' "${EARLY[@]}" >"$STAGE/etc/kvm-guest/modules.early"
printf '%s\n' "${LATE[@]}" >"$STAGE/etc/kvm-guest/modules.late"
cat >"$STAGE/etc/profile" <<'EOF'
export PATH=/sbin:/bin:/usr/sbin:/usr/bin
export PS1='kvm-guest:\w# '
EOF
printf 'root:x:0:0:root:/root:/bin/sh\n' >"$STAGE/etc/passwd"
printf 'root:x:0:\ntty:x:5:\n' >"$STAGE/etc/group"
"$MKCPIO" -root "$STAGE" -out "$INITRD.new" -node /dev/console:c:5:1:0600 -node /dev/null:c:1:3:0666
replace "$INITRD.new" "$INITRD"

# VM images get a nominal Cmd: CRI refuses to create a container when neither
# the pod spec nor the image config names a command, although the shim boots
# the VM and never executes it.
VM_CMD=(-cmd /vm)

# --- kernel image (direct kernel boot) ---------------------------------------

pack localhost/kvm-guest/kernel:latest "$OUT/kernel.tar" "${VM_CMD[@]}" \
	-file "/boot/vmlinuz=$KERNEL:0644" \
	-file "/boot/initrd.img=$INITRD:0644"

# --- bios image (containerDisk booting through SeaBIOS + syslinux) ----------

# Kernel command line, shared by both boot paths (the shim passes its own
# for the kernel image; this is what the bios disk uses).
#  console=ttyS0  the console protocol lives on the first serial port
#  quiet          keep boot fast and the console readable
#  panic=-1       a kernel panic (e.g. /init dying) reboots at once instead of
#                 hanging forever: with libvirt on_reboot=destroy (or QEMU
#                 -no-reboot) the VM then exits, so a broken guest shows up
#                 as a prompt VM exit rather than a silent hang.
CMDLINE="console=ttyS0 quiet panic=-1"
printf '%s\n' "$CMDLINE" | write_if_changed "$WORK/cmdline"

SYSLINUX_CFG=$WORK/syslinux.cfg
write_if_changed "$SYSLINUX_CFG" <<EOF
SERIAL 0 115200
PROMPT 0
TIMEOUT 0
DEFAULT guest
LABEL guest
  LINUX /vmlinuz
  INITRD /initrd.img
  APPEND $CMDLINE
EOF

MBR=/usr/lib/syslinux/mbr/mbr.bin
QCOW=$WORK/guest.qcow2

# le32 N: N as 4 little-endian bytes in printf %b notation.
le32() { printf '\\x%02x\\x%02x\\x%02x\\x%02x' $(($1 & 255)) $((($1 >> 8) & 255)) $((($1 >> 16) & 255)) $((($1 >> 24) & 255)); }
# chs LBA: CHS triple (head, sector|cyl-high, cyl-low) for 255 heads / 63
# sectors, saturated at cylinder 1023 as usual.
chs() {
	local lba=$1 c h s
	c=$((lba / (255 * 63)))
	h=$(((lba / 63) % 255))
	s=$((lba % 63 + 1))
	if ((c > 1023)); then c=1023 h=254 s=63; fi
	printf '\\x%02x\\x%02x\\x%02x' "$h" $((s | ((c >> 2) & 0xc0))) $((c & 255))
}

if stale "$QCOW" "$KERNEL" "$INITRD" "$SYSLINUX_CFG" "$MBR" "$SELF"; then
	log "building $QCOW"
	D=$WORK/disk
	rm -rf "$D"
	mkdir -p "$D"
	START=2048 # partition start, in 512-byte sectors (1 MiB)
	kbytes=$((($(stat -c %s "$KERNEL") + $(stat -c %s "$INITRD")) / 1024))
	PART_MIB=$(((kbytes / 1024) + 8)) # + room for FAT, ldlinux and slack
	PART_SECTORS=$((PART_MIB * 2048))
	truncate -s "${PART_MIB}M" "$D/part.img"
	mkfs.vfat -F 16 -n KVMGUEST -i 4b564d47 --invariant -h "$START" "$D/part.img" >/dev/null
	# Fixed, FAT-representable file times so the disk is reproducible.
	SOURCE_DATE_EPOCH_FAT=${SOURCE_DATE_EPOCH:-0}
	if ((SOURCE_DATE_EPOCH_FAT < 315532800)); then # FAT dates start in 1980
		SOURCE_DATE_EPOCH_FAT=315532800
	fi
	TZ=UTC SOURCE_DATE_EPOCH=$SOURCE_DATE_EPOCH_FAT syslinux --install "$D/part.img"
	TZ=UTC SOURCE_DATE_EPOCH=$SOURCE_DATE_EPOCH_FAT MTOOLS_SKIP_CHECK=1 mcopy -o -i "$D/part.img" \
		"$KERNEL" ::vmlinuz
	TZ=UTC SOURCE_DATE_EPOCH=$SOURCE_DATE_EPOCH_FAT MTOOLS_SKIP_CHECK=1 mcopy -o -i "$D/part.img" \
		"$INITRD" ::initrd.img
	TZ=UTC SOURCE_DATE_EPOCH=$SOURCE_DATE_EPOCH_FAT MTOOLS_SKIP_CHECK=1 mcopy -o -i "$D/part.img" \
		"$SYSLINUX_CFG" ::syslinux.cfg

	truncate -s $(((START + PART_SECTORS) * 512)) "$D/disk.raw"
	dd if="$MBR" of="$D/disk.raw" bs=440 count=1 conv=notrunc status=none
	# Disk signature, then one active partition of type 0x0e (FAT16, LBA)
	# at START, then the boot signature.
	{
		printf 'GMVK\0\0'
		printf '\x80%b\x0e%b%b%b' "$(chs "$START")" "$(chs $((START + PART_SECTORS - 1)))" \
			"$(le32 "$START")" "$(le32 "$PART_SECTORS")"
		head -c 48 /dev/zero
		printf '\x55\xaa'
	} | dd of="$D/disk.raw" bs=1 seek=440 conv=notrunc status=none
	dd if="$D/part.img" of="$D/disk.raw" bs=512 seek="$START" conv=notrunc,sparse status=none
	qemu-img convert -f raw -O qcow2 "$D/disk.raw" "$QCOW.new"
	mv -f "$QCOW.new" "$QCOW"
	rm -rf "$D"
fi

pack localhost/kvm-guest/bios:latest "$OUT/bios.tar" "${VM_CMD[@]}" \
	-file "/disk/guest.qcow2=$QCOW:0644"

# --- pause ------------------------------------------------------------------

pack localhost/kvm-guest/pause:latest "$OUT/pause.tar" \
	-file "/pause=$WORK/bin/pause:0755" \
	-entrypoint /pause

# --- a plain container image (runs with runc beside a VM) ----------------------

pack localhost/kvm-guest/busybox:latest "$OUT/busybox.tar" \
	-file "/bin/busybox=/bin/busybox:0755" \
	-symlink /bin/sh=busybox \
	-entrypoint /bin/busybox -cmd sh

# --- foreign containerDisk (see the header for why iPXE) ----------------------

pack localhost/kvm-guest/foreign:latest "$OUT/foreign.tar" "${VM_CMD[@]}" \
	-file "/disk/ipxe.img=/usr/lib/ipxe/ipxe.iso:0644"

# --- bad containerDisks for negative tests ------------------------------------

BAD=$WORK/bad
mkdir -p "$BAD"
write_if_changed "$BAD/README" <<'EOF'
This containerDisk image deliberately has no disk in /disk/.
EOF
# Small valid images; built once (qemu-img output is fixed for fixed input).
[[ -e $BAD/a.qcow2 ]] || qemu-img create -q -f qcow2 "$BAD/a.qcow2" 1M
[[ -e $BAD/b.raw ]] || truncate -s 1M "$BAD/b.raw"
# 1 MiB that starts with the qcow2 magic and then is nonsense: version
# 0xdeadbeef, header fields from a fixed text pattern.
if stale "$BAD/corrupt.qcow2" "$SELF"; then
	{
		printf 'QFI\xfb\xde\xad\xbe\xef'
		head -c $((1048576 - 8)) < <(yes 'kvm-guest: this is not a qcow2 image')
	} >"$BAD/corrupt.qcow2.new"
	mv -f "$BAD/corrupt.qcow2.new" "$BAD/corrupt.qcow2"
fi

pack localhost/kvm-guest/nodisk:latest "$OUT/nodisk.tar" "${VM_CMD[@]}" \
	-file "/disk/README=$BAD/README:0644"
pack localhost/kvm-guest/twodisks:latest "$OUT/twodisks.tar" "${VM_CMD[@]}" \
	-file "/disk/a.qcow2=$BAD/a.qcow2:0644" \
	-file "/disk/b.raw=$BAD/b.raw:0644"
pack localhost/kvm-guest/escape:latest "$OUT/escape.tar" "${VM_CMD[@]}" \
	-symlink /disk/guest.qcow2=../../../../etc/shadow
pack localhost/kvm-guest/corrupt:latest "$OUT/corrupt.tar" "${VM_CMD[@]}" \
	-file "/disk/guest.qcow2=$BAD/corrupt.qcow2:0644"

log "images in $OUT:"
(cd "$OUT" && ls -l -- *.tar) >&2
