package shim

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	cgroup1stats "github.com/containerd/cgroups/v3/cgroup1/stats"
	"github.com/containerd/errdefs"
	"github.com/containerd/typeurl/v2"

	"github.com/kvm-shim/containerd-shim-kvm-v1/cgroup"
	"github.com/kvm-shim/containerd-shim-kvm-v1/vm"
)

// A cgroupsPath that could leave the cgroup tree is refused before
// anything is made; a systemd one is logged and charges nothing.
func TestCreateVMTaskCgroupPath(t *testing.T) {
	for _, p := range []string{"/kubepods/../../x", "relative/vm", "/"} {
		f := newVMFixture(t)
		f.host.cgroups = &cgroup.Hierarchies{V1: map[string]string{"memory": t.TempDir(), "cpu": t.TempDir(), "cpuacct": t.TempDir()}}
		f.kernelRootfs()
		f.cgroupsPath = p
		if _, err := f.create(nil); !errdefs.IsInvalidArgument(err) {
			t.Errorf("cgroupsPath %q: %v, want InvalidArgument", p, err)
		}
		assertGone(t, filepath.Join(f.bundle, recordFile))
		for _, d := range f.host.cgroups.V1 {
			if left, _ := os.ReadDir(d); len(left) > 0 {
				t.Errorf("cgroupsPath %q left %v in %s", p, left, d)
			}
		}
	}
	f := newVMFixture(t)
	f.kernelRootfs()
	f.cgroupsPath = "kubepods-pod1.slice:cri-containerd:vm1"
	vt, err := f.create(nil)
	if err != nil || vt.cgroup != nil || vt.rec.Cgroup != "" {
		t.Errorf("systemd cgroupsPath: %v, cgroup %v", err, vt.cgroup)
	}
}

// newCgroupFixture is a VM fixture on this host's real cgroups: the VM's
// cgroup is pod/vm1, QEMU's pid is qemuPid, and both groups are removed
// when t ends.
func newCgroupFixture(t *testing.T, hs cgroup.Hierarchies, pod string, qemuPid int) *vmFixture {
	t.Helper()
	f := newVMFixture(t)
	f.host.cgroups = &hs
	f.fake.pid = qemuPid
	f.cgroupsPath = pod + "/vm1"
	t.Cleanup(func() {
		for _, p := range []string{f.cgroupsPath, pod} {
			if g, groupErr := hs.Group(p); groupErr == nil {
				_ = g.Remove()
			}
		}
	})
	return f
}

// On this host's cgroup v1 tree: Create makes the container's cgroup (and
// its missing pod parent), Start moves QEMU in before the vCPUs run, Stats
// reads the cgroup, and Delete removes the container's cgroup.
func TestVMTaskCgroupV1(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to create cgroups")
	}
	hs, err := cgroup.Detect()
	if err != nil || hs.Version() != 1 {
		t.Skipf("needs cgroup v1 (%v)", err)
	}
	qemu := exec.Command("sleep", "60") // stands in for QEMU
	if err = qemu.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = qemu.Process.Kill(); _ = qemu.Wait() }()

	pod := "/kvm-shim-unit-pod" + strconv.Itoa(os.Getpid())
	f := newCgroupFixture(t, hs, pod, qemu.Process.Pid)
	vt := f.created()
	if vt.rec.Cgroup != f.cgroupsPath || !vt.rec.CgroupCreated {
		t.Fatalf("record: cgroup %q created %v", vt.rec.Cgroup, vt.rec.CgroupCreated)
	}
	for _, d := range vt.cgroup.Dirs() {
		if _, statErr := os.Stat(d); statErr != nil {
			t.Errorf("cgroup dir: %v", statErr)
		}
	}
	if _, err = vt.start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if pids, procsErr := vt.cgroup.Procs(); procsErr != nil || len(pids) != 1 || pids[0] != qemu.Process.Pid {
		t.Errorf("cgroup holds %v (%v), want QEMU's pid %d", pids, procsErr, qemu.Process.Pid)
	}
	a, err := vt.cgroupStats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	v, err := typeurl.UnmarshalAny(a)
	if err != nil {
		t.Fatal(err)
	}
	m, ok := v.(*cgroup1stats.Metrics)
	if !ok || m.Pids.GetCurrent() != 1 || m.Memory.GetUsage() == nil {
		t.Errorf("Stats: %T %+v, want v1 Metrics of the cgroup with one process", v, v)
	}

	_ = qemu.Process.Kill()
	_ = qemu.Wait()
	f.fake.stop(vt.rec.Domain, vm.StopDestroyed)
	vt.onStopped(context.Background(), vm.StopDestroyed)
	if err := vt.delete(context.Background()); err != nil {
		t.Fatal(err)
	}
	assertGone(t, vt.cgroup.Dirs()...)
}
