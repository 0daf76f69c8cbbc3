#!/bin/sh
# User-data for the cloud image's boot tests (hack/cloudimage/boot_test.go
# and the integration tests). cloud-init runs it once, as root, late in boot
# (cloud-final, scripts_user), after it has applied hostname, SSH keys and
# network from the config drive. It reports what the guest ended up with on
# the first serial port, one "KVM-CLOUD-<WHAT> <value>" line each, so a test
# can assert them from the console log. Nothing else in the image prints
# these words.
out=/dev/ttyS0
say() { printf '\nKVM-CLOUD-%s\n' "$*" >"$out"; }

say "USERDATA-RAN"
say "HOSTNAME $(hostname)"
say "INSTANCE-ID $(cat /var/lib/cloud/data/instance-id 2>/dev/null)"
for a in $(ip -o addr show scope global | awk '{print $4}'); do
	say "ADDR $a"
done
# Gateways of the default routes (one line per next hop).
for gw in $(ip -4 route show default | grep -o 'via [^ ]*' | cut -d' ' -f2); do
	say "GW4 $gw"
done
for gw in $(ip -6 route show default | grep -o 'via [^ ]*' | cut -d' ' -f2); do
	say "GW6 $gw"
done
for d in $(resolvectl dns 2>/dev/null | sed -n 's/^Link [0-9]* ([^)]*)://p'); do
	say "DNS $d"
done
for d in $(resolvectl domain 2>/dev/null | sed -n 's/^Link [0-9]* ([^)]*)://p'); do
	say "SEARCH $d"
done
grep -v '^#' /home/debian/.ssh/authorized_keys 2>/dev/null | while read -r k; do
	say "SSHKEY $k"
done
# The pod's volumes as the config drive lists them (kvm/volumes, see
# configdrive.VolumesFile): each share where vendor-data's bootcmd mounted
# it (a writable one gets a .kvm-cloud-wrote file), each disk by serial.
mkdir -p /run/kvm-config
if mount -o ro LABEL=config-2 /run/kvm-config 2>/dev/null; then
	[ -r /run/kvm-config/kvm/volumes ] && while read -r kind name mode path; do
		if [ "$kind" = share ]; then
			say "SHARE $name $path $(findmnt -n -o FSTYPE,OPTIONS --mountpoint "$path" | awk '{split($2, o, ","); print $1, o[1]}')"
			[ "$mode" = rw ] && echo cloud >"$path/.kvm-cloud-wrote"
			[ -r "$path/kvm-guest-read" ] && say "FILE $path/kvm-guest-read $(head -n 1 "$path/kvm-guest-read")"
		else
			say "DISK $name $(readlink -f "/dev/disk/by-id/virtio-$name")"
		fi
	done </run/kvm-config/kvm/volumes
	umount /run/kvm-config
fi
say "UPTIME $(cut -d' ' -f1 /proc/uptime)"
say "DONE"
