// Command kvm-qemu-wrapper is the <emulator> of VMs with a pod network.
// libvirt runs it as the QEMU user with QEMU's command line. If the shim
// serves network descriptors for the domain named on that command line,
// the wrapper receives the TAP queues and vhost-net descriptors over the
// domain's socket, appends the matching -netdev and -device arguments and
// execs QEMU; otherwise (libvirt probing capabilities, a VM without a
// network) it execs QEMU unchanged. Either way it first drops every
// privilege QEMU does not need (privs.go).
package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"syscall"

	"github.com/kvm-shim/containerd-shim-kvm-v1/netfd"
)

// qemu is the real emulator; set with -ldflags "-X main.qemu=...".
var qemu = "/usr/bin/qemu-system-x86_64"

func main() {
	if err := dropPrivileges(); err != nil {
		fmt.Fprintf(os.Stderr, "kvm-qemu-wrapper: %v\n", err)
		os.Exit(1)
	}
	args := os.Args[1:]
	bin := qemu
	if domain := netfd.DomainFromArgs(args); domain != "" {
		sock := netfd.SocketPath(netfd.SocketDir, domain)
		if _, err := os.Stat(sock); err == nil {
			g, fds, fetchErr := netfd.Fetch(sock)
			if fetchErr != nil {
				fmt.Fprintf(os.Stderr, "kvm-qemu-wrapper: network of %s: %v\n", domain, fetchErr)
				os.Exit(1)
			}
			if g.QEMU != "" {
				bin = g.QEMU
			}
			args = append(args, g.QEMUArgs(fds)...)
		} else if !errors.Is(err, fs.ErrNotExist) {
			fmt.Fprintf(os.Stderr, "kvm-qemu-wrapper: %v\n", err)
			os.Exit(1)
		}
	}
	err := syscall.Exec(bin, append([]string{bin}, args...), os.Environ())
	fmt.Fprintf(os.Stderr, "kvm-qemu-wrapper: exec %s: %v\n", bin, err)
	os.Exit(127)
}
