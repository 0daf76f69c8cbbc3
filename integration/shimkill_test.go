//go:build integration

package integration

import (
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestCRIShimKilled: kill -9 of a CRI pod's shim. containerd runs the
// cleanup `delete` for the pod's tasks (the VM is destroyed: the new shim
// does not adopt it); kubelet's recovery, a new sandbox of the same pod uid
// and the container created and started in it, boots the VM on the same
// disk: what the guest wrote before, it reads after. Removing the dead
// sandbox leaves the new VM alone, and nothing is left at the end. The
// guest's uptime before and after and the time from the kill to the new
// VM's agent answering are logged.
func TestCRIShimKilled(t *testing.T) {
	s := requireKVM(t, "bios", "pause")
	image := s.images["bios"].ref
	s.forEachFlavour(t, func(t *testing.T, c *containerd) {
		c.cleanupAfter(t)
		cl := c.cri(t)
		v := c.startPodVM(t, cl, "vm-shimkill", image)
		token := fmt.Sprintf("KVM-SHIMKILL-%d", time.Now().UnixNano())
		writeDiskToken(t, cl, v.cid, token)
		before := guestUptime(t, cl, v.cid)

		shims := c.ShimProcesses()
		if len(shims) != 1 {
			t.Fatalf("want the pod's one shim, found %v", shims)
		}
		killed := time.Now()
		if err := syscall.Kill(shims[0].Pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		// containerd sees the shim go and reports the container exited;
		// kubelet then finds the sandbox not ready and re-creates it.
		st := cl.waitContainerState(t, v.cid, cri.ContainerState_CONTAINER_EXITED, stopTimeout)
		if st.ExitCode == 0 {
			t.Errorf("the container of a killed shim exited with 0, want a failure status")
		}
		ctx, cancel := criCtx()
		if _, err := cl.Runtime.StopPodSandbox(ctx, &cri.StopPodSandboxRequest{PodSandboxId: v.pod.id}); err != nil {
			t.Errorf("StopPodSandbox %s (dead shim): %v", v.pod.id, err)
		}
		cancel()
		again := c.restartPod(t, cl, v, image)
		cl.waitAgentCRI(t, again.cid, bootTimeout)
		after := guestUptime(t, cl, again.cid)
		t.Logf("guest uptime %.1fs before the shim's kill, %.1fs after; the new VM's agent answered %v after the kill",
			before, after, time.Since(killed).Round(time.Millisecond))
		if got := readDiskToken(t, cl, again.cid, len(token)); got != token {
			t.Errorf("after the shim's kill the guest reads %q from its disk, want %q (written before)", got, token)
		}

		ctx, cancel = criCtx()
		if _, err := cl.Runtime.RemoveContainer(ctx, &cri.RemoveContainerRequest{ContainerId: v.cid}); err != nil {
			t.Errorf("RemoveContainer %s (dead): %v", v.cid, err)
		}
		cancel()
		cl.stopAndRemovePod(t, v.pod)
		if got := readDiskToken(t, cl, again.cid, len(token)); got != token {
			t.Errorf("after the dead sandbox's removal the guest reads %q from its disk, want %q", got, token)
		}
		if err := cl.stopContainer(again); err != nil {
			t.Error(err)
		}
		cl.removePod(t, again)
		assertNothingLeft(t, c, append(v.shimIDs(), again.shimIDs()...)...)
	})
}

// guestUptime is the guest's /proc/uptime in seconds.
func guestUptime(t *testing.T, cl *criClient, cid string) float64 {
	t.Helper()
	r, err := cl.execSync(cid, 10, "cat", "/proc/uptime")
	if err != nil || r.ExitCode != 0 {
		t.Fatalf("guest uptime: %v %v", r, err)
	}
	f, err := strconv.ParseFloat(strings.Fields(string(r.Stdout) + " 0")[0], 64)
	if err != nil {
		t.Fatalf("guest uptime %q: %v", r.Stdout, err)
	}
	return f
}

// guestBootID is the guest kernel's boot id: a new one at every boot.
func guestBootID(t *testing.T, cl *criClient, cid string) string {
	t.Helper()
	// An agent that has just answered can still refuse the next command
	// for a while on a loaded host (libvirt: "Guest agent not available
	// for now" after an earlier command of the boot timed out): ask again.
	var id string
	if err := poll(time.Minute, func() (bool, string) {
		r, err := cl.execSync(cid, 10, "cat", "/proc/sys/kernel/random/boot_id")
		if err != nil {
			return false, err.Error()
		}
		if r.ExitCode != 0 || len(r.Stdout) == 0 {
			return false, fmt.Sprintf("exit %d: %s", r.ExitCode, r.Stderr)
		}
		id = strings.TrimSpace(string(r.Stdout))
		return true, ""
	}); err != nil {
		t.Fatalf("guest boot id: %v", err)
	}
	return id
}
