// Command containerd-shim-kvm-v1 is the containerd runtime shim for
// io.containerd.kvm.v1: it runs the containers of a pod as libvirt/QEMU
// virtual machines. Besides the shim v2 protocol it answers `check` (host
// preflight), `-info` (runtime info for containerd 2.x) and `-v`.
package main

import (
	"context"
	"fmt"
	"os"

	shimlib "github.com/containerd/containerd/runtime/v2/shim"

	"github.com/kvm-shim/containerd-shim-kvm-v1/check"
	"github.com/kvm-shim/containerd-shim-kvm-v1/shim"
)

// Set with -ldflags "-X main.version=... -X main.revision=...".
var (
	version  = "dev"
	revision = "unknown"
)

func main() {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "check":
			os.Exit(check.Run(context.Background(), os.Stdout, os.Args[2:]))
		case "-info", "--info":
			if err := shim.WriteRuntimeInfo(os.Stdout, version, revision); err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(1)
			}
			return
		case "-v", "--v", "-version", "--version":
			fmt.Printf("%s:\n  Version:  %s\n  Revision: %s\n  Runtime:  %s\n", os.Args[0], version, revision, shim.RuntimeName)
			return
		}
	}
	// QEMU is libvirt's child, not ours: the shim reaps no processes, so
	// the helpers it runs (qemu-img, mkfs.vfat) are waited for normally.
	// With plain_containers on, the task service starts reaping (and
	// becomes a subreaper) itself, before its first child (shim/plain.go).
	shimlib.RunManager(context.Background(), shim.Manager{}, func(c *shimlib.Config) {
		c.NoReaper = true
		c.NoSubreaper = true
	})
}
