package main

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// dropPrivileges leaves QEMU nothing it does not need before the wrapper
// execs it: no_new_privs (no setuid or file capability can raise the
// guest's QEMU again; QEMU's own seccomp sandbox sets it too, so it
// breaks nothing), no ambient or inheritable capabilities, and, unless
// libvirt was told to run QEMU as root, no permitted or effective ones.
// libvirt starts the wrapper under the VM's uid with its capabilities
// already cleared; this makes that hold whatever started it.
func dropPrivileges() error {
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("set no_new_privs: %w", err)
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		return fmt.Errorf("clear ambient capabilities: %w", err)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("read capabilities: %w", err)
	}
	for i := range data {
		data[i].Inheritable = 0
		if os.Geteuid() != 0 {
			data[i].Permitted, data[i].Effective = 0, 0
		}
	}
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("drop capabilities: %w", err)
	}
	return nil
}
