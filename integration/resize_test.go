//go:build integration

package integration

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
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
// would) without a reboot, the new vCPU thread charged to the pod's cgroup
// like the others; then its memory from 256 to 512 MiB through virtio-mem
// and back, seen in the guest's MemTotal; then from 2 to 1 vCPU, CPU 1
// taken offline in the guest by its agent while QEMU keeps the thread,
// back to 2 (onlined again) and to 3 (a real hot-plug).
// ContainerStatus reports the new resources. Sizes above the VM's
// maximums, memory below what the guest booted with and a paused VM are
// refused and leave the VM as it was.
func TestCRIResize(t *testing.T) {
	s := requireKVM(t, "kernel", "pause")
	h := hostCgroups(t)
	s.forEachFlavour(t, func(t *testing.T, c *containerd) {
		parent := c.podCgroup(t, h) // removed after the pods: cleanups run last first
		c.cleanupAfter(t)
		cl := c.cri(t)
		cfg := containerConfig("vm", s.images["kernel"].ref, map[string]string{
			"kvm.containerd.io/max-vcpus": "3", "kvm.containerd.io/max-memory-mib": "512"})
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
		memKB, err := strconv.Atoi(mem)
		if err != nil {
			t.Fatalf("guest MemTotal %q: %v", mem, err)
		}
		_, pid, err := c.taskStatus(nsCRI, cid)
		if err != nil {
			t.Fatal(err)
		}
		memLimit := cfg.Linux.Resources.MemoryLimitInBytes // 256 MiB

		start := time.Now()
		if err := updateCPU(cl, cid, 2, memLimit); err != nil {
			t.Fatalf("UpdateContainerResources to 2 CPUs: %v", err)
		}
		called := time.Since(start)
		seen := waitGuestLine(t, v.logPath, "KVM-GUEST-CPUS", "0-1", time.Minute)
		t.Logf("1 -> 2 vCPUs: UpdateContainerResources took %v, the guest had CPU 1 online %v later", called, seen)
		vcpuThreads(t, pid, 2)
		checkThreadsInCgroup(t, h, pid, parent+"/"+cid)
		checkStatusResources(t, cl, cid, 200000, memLimit)

		// Memory: 256 -> 512 MiB, plugged by the guest's virtio_mem.
		start = time.Now()
		if err := updateCPU(cl, cid, 2, 2*memLimit); err != nil {
			t.Fatalf("UpdateContainerResources to 512 MiB: %v", err)
		}
		called = time.Since(start)
		grown := strconv.Itoa(memKB + int(memLimit>>10))
		seen = waitGuestLine(t, v.logPath, "KVM-GUEST-MEMTOTAL", grown, time.Minute)
		t.Logf("256 -> 512 MiB: UpdateContainerResources took %v, the guest's MemTotal was %s kB %v later", called, grown, seen)
		checkStatusResources(t, cl, cid, 200000, 2*memLimit)

		// Refused, the VM unchanged: above each maximum, memory below
		// what the guest booted with, a paused VM.
		for _, r := range []struct {
			what      string
			cpus, mem int64
			want      string
		}{
			{what: "4 vCPUs, above max-vcpus 3", cpus: 4, mem: 2 * memLimit, want: "linux.resources.cpu"},
			{what: "768 MiB, above max-memory-mib 512", cpus: 2, mem: 3 * memLimit, want: "linux.resources.memory.limit"},
			{what: "128 MiB, below the boot memory", cpus: 2, mem: memLimit / 2, want: "linux.resources.memory.limit"},
		} {
			if err := updateCPU(cl, cid, r.cpus, r.mem); err == nil || !strings.Contains(err.Error(), r.want) {
				t.Errorf("%s: %v, want an error naming %s", r.what, err, r.want)
			}
		}
		c.mustCtr(t, nsCRI, "task", "pause", cid)
		if err := updateCPU(cl, cid, 2, memLimit); err == nil || !strings.Contains(err.Error(), "paused") {
			t.Errorf("resize of a paused VM: %v, want an error saying it is paused", err)
		}
		c.mustCtr(t, nsCRI, "task", "resume", cid)
		time.Sleep(time.Second)
		if got := lastGuestLine(v.logPath, "KVM-GUEST-CPUS"); got != "0-1" {
			t.Errorf("after refused resizes the guest has CPUs %s, want 0-1", got)
		}
		if got := lastGuestLine(v.logPath, "KVM-GUEST-MEMTOTAL"); got != grown {
			t.Errorf("after refused resizes the guest has MemTotal %s kB, want %s", got, grown)
		}
		vcpuThreads(t, pid, 2)
		checkStatusResources(t, cl, cid, 200000, 2*memLimit)

		// The idle guest gives the hot-added memory back (it is movable).
		if err := updateCPU(cl, cid, 2, memLimit); err != nil {
			t.Fatalf("UpdateContainerResources back to 256 MiB: %v", err)
		}
		waitGuestLine(t, v.logPath, "KVM-GUEST-MEMTOTAL", mem, time.Minute)

		// vCPUs: 2 -> 1 -> 2 -> 3. Fewer are taken offline in the guest
		// (highest first) and QEMU keeps their threads; more are onlined
		// in the guest first, then plugged.
		for _, r := range []struct {
			cpus    int64
			online  string
			threads int
		}{{1, "0", 2}, {2, "0-1", 2}, {3, "0-2", 3}} {
			from := lastGuestLine(v.logPath, "KVM-GUEST-CPUS")
			start = time.Now()
			if err := updateCPU(cl, cid, r.cpus, memLimit); err != nil {
				t.Fatalf("UpdateContainerResources to %d CPUs: %v", r.cpus, err)
			}
			called = time.Since(start)
			seen = waitGuestLine(t, v.logPath, "KVM-GUEST-CPUS", r.online, time.Minute)
			t.Logf("online CPUs %s -> %s: UpdateContainerResources took %v, the guest showed them %v later", from, r.online, called, seen)
			vcpuThreads(t, pid, r.threads)
			checkStatusResources(t, cl, cid, r.cpus*100000, memLimit)
		}
		checkThreadsInCgroup(t, h, pid, parent+"/"+cid)

		if err := cl.stopContainer(v); err != nil {
			t.Fatal(err)
		}
		cl.removePod(t, v)
		assertNothingLeft(t, c, v.shimIDs()...)
	})
}

// checkStatusResources checks the resources CRI ContainerStatus reports.
func checkStatusResources(t *testing.T, cl *criClient, cid string, quota, memory int64) {
	t.Helper()
	r := cl.containerStatus(t, cid).GetResources().GetLinux()
	if r == nil {
		t.Errorf("ContainerStatus of %s has no linux resources", cid)
		return
	}
	if r.CpuQuota != quota || r.MemoryLimitInBytes != memory {
		t.Errorf("ContainerStatus resources: cpu quota %d, memory %d; want %d, %d", r.CpuQuota, r.MemoryLimitInBytes, quota, memory)
	}
}

// TestCRIResizeBadAnnotations: malformed resize maximums are refused at
// create, naming the annotation.
func TestCRIResizeBadAnnotations(t *testing.T) {
	runCRIBadInputs(t, []badInput{
		{name: "max-memory-mib", image: "kernel", annotations: map[string]string{"kvm.containerd.io/max-memory-mib": "2Gi"},
			want: []string{"kvm.containerd.io/max-memory-mib"}, criCode: codes.InvalidArgument},
		{name: "max-memory-mib-below", image: "kernel", annotations: map[string]string{"kvm.containerd.io/max-memory-mib": "100"},
			want: []string{"kvm.containerd.io/max-memory-mib"}, criCode: codes.InvalidArgument},
		{name: "max-vcpus", image: "kernel", annotations: map[string]string{"kvm.containerd.io/max-vcpus": "two"},
			want: []string{"kvm.containerd.io/max-vcpus"}, criCode: codes.InvalidArgument},
	})
}
