//go:build integration

package integration

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// exitPanicked is the exit status of a VM whose guest kernel panicked
// (vm.ExitPanicked; docs/lifecycle.md).
const exitPanicked = 250

// TestCRILifecycle proves the rows of the lifecycle table
// (docs/lifecycle.md) through CRI, one VM pod per row, the four booting
// at once: a reboot inside the guest keeps the same QEMU process and the
// container RUNNING (and the rebooted guest still powers off on
// StopContainer within its grace period: exit 0); a power-off inside the
// guest is exit 0; a guest kernel panic (sysrq c, reported by the
// domain's pvpanic device) is exit 250 with the shim's log saying the
// guest panicked; a guest that ignores the power button is destroyed
// when StopContainer's grace period ends: exit 137.
func TestCRILifecycle(t *testing.T) {
	s := requireKVM(t, "kernel", "pause")
	image := s.images["kernel"].ref
	s.forEachFlavourAtOnce(t, func(t *testing.T, c *containerd) {
		c.cleanupAfter(t)
		cl := c.cri(t)
		start := time.Now()
		rows := []struct {
			name string
			row  func(t *testing.T, v *podContainer)
		}{
			{"reboot", func(t *testing.T, v *podContainer) { c.rowReboot(t, cl, v) }},
			{"poweroff", func(t *testing.T, v *podContainer) { cl.rowPoweroff(t, v) }},
			{"panic", func(t *testing.T, v *podContainer) { c.rowPanic(t, cl, v) }},
			{"grace", func(t *testing.T, v *podContainer) { cl.rowPastGrace(t, v) }},
		}
		vms := make([]*podContainer, len(rows))
		for i, r := range rows {
			vms[i] = c.startPodContainerWith(t, cl, "vm-life-"+r.name, "kvm", image, noTimerCheck)
		}
		var ids []shimID
		for i, r := range rows {
			v := vms[i]
			cl.waitContainerState(t, v.cid, cri.ContainerState_CONTAINER_RUNNING, bootTimeout)
			cl.waitAgentCRI(t, v.cid, bootTimeout)
			t.Run(r.name, func(t *testing.T) { r.row(t, v) })
			cl.removePod(t, v)
			ids = append(ids, v.shimIDs()...)
		}
		assertNothingLeft(t, c, ids...)
		t.Logf("the lifecycle rows took %v", time.Since(start).Round(time.Second))
	})
}

// inGuest runs script in the guest in the background, its output
// discarded, so that the exec returns before the script reboots,
// powers off or panics the guest.
func (cl *criClient) inGuest(t *testing.T, cid, script string) {
	t.Helper()
	r, err := cl.execSync(cid, 10, "sh", "-c", "(sleep 1; "+script+") </dev/null >/dev/null 2>&1 &")
	if err != nil || r.ExitCode != 0 {
		t.Fatalf("exec %q in the guest: %v %v", script, r, err)
	}
}

// qemuPid is the pid of the domain's QEMU, from libvirt's pid file.
func qemuPid(t *testing.T, domain string) string {
	t.Helper()
	b, err := os.ReadFile("/run/libvirt/qemu/" + domain + ".pid")
	if err != nil {
		t.Fatalf("QEMU pid of %s: %v", domain, err)
	}
	return strings.TrimSpace(string(b))
}

// rowReboot: `reboot` in the guest restarts it in the same QEMU; the
// container stays RUNNING; StopContainer then powers it off (exit 0).
func (c *containerd) rowReboot(t *testing.T, cl *criClient, v *podContainer) {
	dom := c.podDomain(t, v)
	pid, boot := qemuPid(t, dom), guestBootID(t, cl, v.cid)
	cl.inGuest(t, v.cid, "reboot")
	if err := poll(bootTimeout, func() (bool, string) {
		b, _ := os.ReadFile(v.logPath)
		n := strings.Count(string(b), readyLine)
		return n >= 2, fmt.Sprintf("%d %s lines in the container log, want 2", n, readyLine)
	}); err != nil {
		t.Fatal(err)
	}
	if err := waitLog(v.logPath, "KVM-GUEST-REBOOT", time.Second); err != nil {
		t.Error(err)
	}
	cl.waitAgentCRI(t, v.cid, bootTimeout)
	if again := guestBootID(t, cl, v.cid); again == boot {
		t.Errorf("the guest's boot id is still %s: it did not reboot", boot)
	}
	if again := qemuPid(t, dom); again != pid {
		t.Errorf("QEMU pid %s before the reboot, %s after: want the same process", pid, again)
	}
	if st := cl.containerStatus(t, v.cid); st.State != cri.ContainerState_CONTAINER_RUNNING {
		t.Errorf("after the guest's reboot the container is %s, want RUNNING", st.State)
	}
	if err := cl.stopContainer(v); err != nil {
		t.Errorf("StopContainer within its grace period after the reboot: %v", err)
	}
}

// rowPoweroff: `poweroff` in the guest ends the container with 0.
func (cl *criClient) rowPoweroff(t *testing.T, v *podContainer) {
	cl.inGuest(t, v.cid, "poweroff")
	st := cl.waitContainerState(t, v.cid, cri.ContainerState_CONTAINER_EXITED, stopTimeout)
	if st.ExitCode != 0 {
		t.Errorf("the guest powered off: exit code %d, want 0", st.ExitCode)
	}
}

// rowPanic: a guest kernel panic ends the container with exitPanicked,
// and the shim logs that the guest panicked.
func (c *containerd) rowPanic(t *testing.T, cl *criClient, v *podContainer) {
	mark := c.LogSize()
	cl.inGuest(t, v.cid, "echo c > /proc/sysrq-trigger")
	at := time.Now()
	st := cl.waitContainerState(t, v.cid, cri.ContainerState_CONTAINER_EXITED, stopTimeout)
	t.Logf("the panic's exit reached CRI %v after the exec returned (the guest waits 1 s first)", time.Since(at).Round(100*time.Millisecond))
	if st.ExitCode != exitPanicked {
		t.Errorf("the guest panicked: exit code %d (%s), want %d", st.ExitCode, st.Reason, exitPanicked)
	}
	if err := waitLog(v.logPath, "Kernel panic", time.Second); err != nil {
		t.Errorf("the guest's console shows no panic: %v", err)
	}
	if tail := c.LogTail(mark, 400); !strings.Contains(tail, "the guest's kernel panicked") {
		t.Errorf("the shim did not log the panic; log since the exec:\n%s", c.LogTail(mark, 30))
	}
}

// rowPastGrace: a guest that ignores the power button (its /init's
// reader of the button killed) is destroyed when StopContainer's grace
// period ends: exit 137.
func (cl *criClient) rowPastGrace(t *testing.T, v *podContainer) {
	r, err := cl.execSync(v.cid, 10, "killall", "dd")
	if err != nil || r.ExitCode != 0 {
		t.Fatalf("stop the guest's power button reader: %v %v", r, err)
	}
	if err := waitLog(v.logPath, "shutdown requests will be ignored", 10*time.Second); err != nil {
		t.Fatal(err)
	}
	const grace = 3
	ctx, cancel := criCtx()
	defer cancel()
	start := time.Now()
	if _, err := cl.Runtime.StopContainer(ctx, &cri.StopContainerRequest{ContainerId: v.cid, Timeout: grace}); err != nil {
		t.Fatalf("StopContainer: %v", err)
	}
	took := time.Since(start)
	st := cl.containerStatus(t, v.cid)
	if st.State != cri.ContainerState_CONTAINER_EXITED || st.ExitCode != 137 {
		t.Errorf("after StopContainer past its grace period: %s exit code %d, want EXITED 137", st.State, st.ExitCode)
	}
	if took < grace*time.Second {
		t.Errorf("StopContainer returned after %v, before its %d s grace period", took, grace)
	}
	t.Logf("StopContainer with a %d s grace period, the power button ignored: %v", grace, took.Round(100*time.Millisecond))
}
