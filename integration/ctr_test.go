//go:build integration

package integration

import (
	"fmt"
	"testing"
	"time"

	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/testenv"
)

const (
	// bootTimeout bounds a TCG boot to the ready line (about 5 s measured).
	bootTimeout = 2 * time.Minute
	// stopTimeout bounds an ACPI power-off or a destroy.
	stopTimeout = time.Minute

	readyLine    = "KVM-GUEST-READY"
	poweroffLine = "KVM-GUEST-POWEROFF"
)

// kvmRun is the ctr run arguments that select the kvm shim and its config.
func (c *containerd) kvmRun(args ...string) []string {
	return append([]string{"--runtime", kvmRuntime, "--runtime-config-path", c.ShimConfigPath}, args...)
}

// bootAndStop runs image in the foreground with ctr, waits for ready on
// its console, sends signal with ctr task kill, then expects the console
// line stopped (if any) and ctr run's exit status; nothing may be left.
func (c *containerd) bootAndStop(t *testing.T, image, id, ready, signal, stopped string, wantStatus int) {
	t.Helper()
	c.cleanupAfter(t)
	f := c.runForeground(t, nsDefault, c.kvmRun(c.suite.images[image].ref, id)...)
	f.waitOutput(t, ready, bootTimeout)
	c.mustCtr(t, nsDefault, "task", "kill", "-s", signal, id)
	if stopped != "" {
		f.waitOutput(t, stopped, stopTimeout)
	}
	if code := f.wait(t, stopTimeout); code != wantStatus {
		t.Fatalf("ctr run exited %d after %s, want %d", code, signal, wantStatus)
	}
	assertNothingLeft(t, c, shimID{nsDefault, id})
}

// TestCtrPowerOff: SIGTERM asks the guest to power off; ctr run exits 0.
func TestCtrPowerOff(t *testing.T) {
	s := requireKVM(t, "kernel")
	s.forEachFlavour(t, func(t *testing.T, c *containerd) {
		c.bootAndStop(t, "kernel", "it-kernel-term", readyLine, "TERM", poweroffLine, 0)
	})
}

// TestCtrKill: SIGKILL destroys the VM; ctr run exits 137.
func TestCtrKill(t *testing.T) {
	s := requireKVM(t, "kernel")
	s.forEachFlavour(t, func(t *testing.T, c *containerd) {
		c.bootAndStop(t, "kernel", "it-kernel-kill", readyLine, "KILL", "", 137)
	})
}

// TestCtrDetached: run -d, task ls/ps, pause and resume, kill, delete.
func TestCtrDetached(t *testing.T) {
	s := requireKVM(t, "kernel")
	s.forEachFlavour(t, func(t *testing.T, c *containerd) {
		c.cleanupAfter(t)
		id := "it-kernel-detached"
		c.mustCtr(t, nsDefault, append([]string{"run", "-d"}, c.kvmRun(s.images["kernel"].ref, id)...)...)
		c.waitTaskStatus(t, nsDefault, id, "RUNNING", bootTimeout)

		pids := c.taskPids(t, nsDefault, id)
		if len(pids) != 1 {
			t.Fatalf("ctr task ps %s: pids %v, want exactly one", id, pids)
		}
		qemu := pids[0]
		if name, err := exe(qemu); err != nil || name != "qemu-system-x86_64" {
			t.Fatalf("task pid %d is %q (%v), want a live qemu-system-x86_64", qemu, name, err)
		}
		if _, pid, _ := c.taskStatus(nsDefault, id); pid != qemu {
			t.Errorf("ctr task ls pid %d differs from ctr task ps pid %d", pid, qemu)
		}
		// The leftover check must see a running VM, or it proves nothing.
		if doms, err := c.ownDomains(); err != nil || len(doms) != 1 {
			t.Errorf("libvirt domains of this shim while running: %v (%v), want one", doms, err)
		}
		if st := testenv.StateDirLeftovers(c.ShimStateDir); len(st) == 0 {
			t.Errorf("shim state_dir %s looks empty while a VM runs", c.ShimStateDir)
		}

		c.mustCtr(t, nsDefault, "task", "pause", id)
		c.waitTaskStatus(t, nsDefault, id, "PAUSED", stopTimeout)
		c.mustCtr(t, nsDefault, "task", "resume", id)
		c.waitTaskStatus(t, nsDefault, id, "RUNNING", stopTimeout)
		if !alive(qemu) {
			t.Fatalf("qemu pid %d gone after resume", qemu)
		}

		c.mustCtr(t, nsDefault, "task", "kill", "-s", "KILL", id)
		c.waitTaskStatus(t, nsDefault, id, "STOPPED", stopTimeout)
		if err := poll(stopTimeout, func() (bool, string) {
			return !alive(qemu), fmt.Sprintf("qemu pid %d still alive", qemu)
		}); err != nil {
			t.Fatal(err)
		}
		c.deleteTask(t, nsDefault, id, 137)
		c.mustCtr(t, nsDefault, "containers", "delete", id)
		assertNothingLeft(t, c, shimID{nsDefault, id})
	})
}

// TestCtrBootDisk boots containerDisk images through the BIOS.
func TestCtrBootDisk(t *testing.T) {
	for _, tc := range []struct {
		image, want string
	}{
		{"bios", readyLine},
		// iPXE from Debian's ipxe.iso: its banner reaches the serial port
		// only through SeaBIOS's serial console (see hack/guest/build.sh).
		{"foreign", "Open Source Network Boot Firmware"},
	} {
		t.Run(tc.image, func(t *testing.T) {
			s := requireKVM(t)
			if _, ok := s.images[tc.image]; !ok && knownImages[tc.image].optional {
				t.Skipf("optional image %s not built", knownImages[tc.image].file)
			}
			s.requireImages(t, tc.image)
			s.forEachFlavour(t, func(t *testing.T, c *containerd) {
				c.bootAndStop(t, tc.image, "it-disk-"+tc.image, tc.want, "KILL", "", 137)
			})
		})
	}
}
