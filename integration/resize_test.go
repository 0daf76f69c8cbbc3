//go:build integration

package integration

import (
	"os"
	"strings"
	"testing"
	"time"

	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// lastGuestLine returns the value of the last "<prefix> <value>" line the
// guest printed into the CRI log at path.
func lastGuestLine(path, prefix string) string {
	b, _ := os.ReadFile(path)
	v := ""
	for _, l := range strings.Split(string(b), "\n") {
		if i := strings.Index(l, prefix+" "); i >= 0 {
			v = strings.TrimSpace(l[i+len(prefix)+1:])
		}
	}
	return v
}

// waitGuestLine waits until the guest's last "<prefix>" line says want
// and returns how long that took.
func waitGuestLine(t *testing.T, path, prefix, want string, timeout time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	if err := poll(timeout, func() (bool, string) {
		got := lastGuestLine(path, prefix)
		return got == want, prefix + " is " + got + ", want " + want
	}); err != nil {
		t.Fatal(err)
	}
	return time.Since(start)
}

func updateCPU(cl *criClient, cid string, cpus int64, memory int64) error {
	ctx, cancel := criCtx()
	defer cancel()
	_, err := cl.Runtime.UpdateContainerResources(ctx, &cri.UpdateContainerResourcesRequest{
		ContainerId: cid,
		Linux:       &cri.LinuxContainerResources{CpuPeriod: 100000, CpuQuota: cpus * 100000, MemoryLimitInBytes: memory},
	})
	return err
}

// TestCRIResize resizes a running VM through CRI UpdateContainerResources
// on both containerd flavours, as kubelet's in-place pod resize does: from
// 1 to 2 vCPUs, seen by the guest (which onlines the new CPU, as udev
// would) without a reboot; the new vCPU thread is charged to the pod's
// cgroup like the others. A memory change and a size above the VM's
// maximum are refused and leave the VM as it was, and so is a shrink back
// to 1 vCPU (vCPUs are never removed live).
func TestCRIResize(t *testing.T) {
	s := requireKVM(t, "kernel", "pause")
	h := hostCgroups(t)
	s.forEachFlavour(t, func(t *testing.T, c *containerd) {
		parent := c.podCgroup(t, h) // removed after the pods: cleanups run last first
		c.cleanupAfter(t)
		cl := c.cri(t)
		cfg := containerConfig("vm", s.images["kernel"].ref, map[string]string{"kvm.containerd.io/max-vcpus": "2"})
		v := c.startVMIn(t, cl, "vm-resize", parent, cfg)
		cid := v.cid
		if err := waitLog(v.logPath, readyLine, bootTimeout); err != nil {
			t.Fatal(err)
		}
		waitGuestLine(t, v.logPath, "KVM-GUEST-CPUS", "0", bootTimeout)
		var mem string // the guest prints it right after its CPUs
		if err := poll(10*time.Second, func() (bool, string) {
			mem = lastGuestLine(v.logPath, "KVM-GUEST-MEMTOTAL")
			return mem != "", "no KVM-GUEST-MEMTOTAL line"
		}); err != nil {
			t.Fatal(err)
		}
		_, pid, err := c.taskStatus(nsCRI, cid)
		if err != nil {
			t.Fatal(err)
		}
		memLimit := cfg.Linux.Resources.MemoryLimitInBytes

		start := time.Now()
		if err := updateCPU(cl, cid, 2, memLimit); err != nil {
			t.Fatalf("UpdateContainerResources to 2 CPUs: %v", err)
		}
		called := time.Since(start)
		seen := waitGuestLine(t, v.logPath, "KVM-GUEST-CPUS", "0-1", time.Minute)
		t.Logf("1 -> 2 vCPUs: UpdateContainerResources took %v, the guest had CPU 1 online %v later", called, seen)
		vcpuThreads(t, pid, 2)
		checkThreadsInCgroup(t, h, pid, parent+"/"+cid)
		if st := cl.containerStatus(t, cid); st.GetResources().GetLinux() != nil && st.Resources.Linux.CpuQuota != 200000 {
			t.Errorf("ContainerStatus resources after the resize: cpu quota %d, want 200000", st.Resources.Linux.CpuQuota)
		}

		// Refused: above the annotation's maximum, and a memory change.
		if err := updateCPU(cl, cid, 3, memLimit); err == nil || !strings.Contains(err.Error(), "linux.resources.cpu") {
			t.Errorf("resize to 3 vCPUs, above max-vcpus 2: %v, want an error naming linux.resources.cpu", err)
		}
		if err := updateCPU(cl, cid, 2, 2*memLimit); err == nil || !strings.Contains(err.Error(), "linux.resources.memory.limit") {
			t.Errorf("memory change: %v, want an error naming linux.resources.memory.limit", err)
		}
		time.Sleep(time.Second)
		if got := lastGuestLine(v.logPath, "KVM-GUEST-CPUS"); got != "0-1" {
			t.Errorf("after refused resizes the guest has CPUs %s, want 0-1", got)
		}
		if got := lastGuestLine(v.logPath, "KVM-GUEST-MEMTOTAL"); got != mem {
			t.Errorf("after refused resizes the guest has MemTotal %s kB, want %s", got, mem)
		}

		// Removing vCPUs live is refused (libvirt 9.0 here loses count of
		// a vCPU the guest released late); the VM keeps both.
		if err := updateCPU(cl, cid, 1, memLimit); err == nil || !strings.Contains(err.Error(), "linux.resources.cpu") {
			t.Errorf("2 -> 1 vCPUs: %v, want a refusal naming linux.resources.cpu", err)
		}
		time.Sleep(time.Second)
		if got := lastGuestLine(v.logPath, "KVM-GUEST-CPUS"); got != "0-1" {
			t.Errorf("after a refused shrink the guest has CPUs %s, want 0-1", got)
		}
		vcpuThreads(t, pid, 2)

		if err := cl.stopContainer(v); err != nil {
			t.Fatal(err)
		}
		cl.removePod(t, v)
		assertNothingLeft(t, c, v.shimIDs()...)
	})
}
