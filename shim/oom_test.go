package shim

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	eventstypes "github.com/containerd/containerd/api/events"
	"github.com/containerd/containerd/api/types/task"
	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/kvm-shim/containerd-shim-kvm-v1/cgroup"
	"github.com/kvm-shim/containerd-shim-kvm-v1/vm"
)

// On this host's cgroups, with the kernel's own OOM killer: a process
// standing in for QEMU gets the spec's oomScoreAdj at Start, is killed
// for memory by its pod cgroup's limit, and the task exits 137 with
// TaskOOM before its TaskExit (CRI's OOMKilled); a crash without an OOM
// kill keeps libvirt's status.
func TestVMTaskOOMKilled(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to create cgroups")
	}
	hs, err := cgroup.Detect()
	if err != nil {
		t.Skipf("no cgroups: %v", err)
	}
	trigger := filepath.Join(t.TempDir(), "go")
	// The stand-in waits in the shell until Start moved it into the
	// cgroup, then allocates without bound.
	qemu := exec.Command("sh", "-c", `while [ ! -e "$1" ]; do sleep 0.02; done; exec tail /dev/zero`, "sh", trigger)
	if err = qemu.Start(); err != nil {
		t.Fatal(err)
	}
	ended := make(chan struct{})
	go func() { _ = qemu.Wait(); close(ended) }()
	t.Cleanup(func() { _ = qemu.Process.Kill(); <-ended })

	pod := "/kvm-shim-unit-oom" + strconv.Itoa(os.Getpid())
	f := newCgroupFixture(t, hs, pod, qemu.Process.Pid)
	adj := 1000
	f.kernelRootfs()
	vt, err := f.createSpec(&specs.Spec{Process: &specs.Process{OOMScoreAdj: &adj}})
	if err != nil {
		t.Fatal(err)
	}
	limitPodMemory(t, hs, pod, 32<<20)
	if _, err = vt.start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if b, readErr := os.ReadFile("/proc/" + strconv.Itoa(qemu.Process.Pid) + "/oom_score_adj"); readErr != nil ||
		strings.TrimSpace(string(b)) != "1000" {
		t.Errorf("QEMU's oom_score_adj = %q (%v), want the spec's 1000", b, readErr)
	}
	if err = os.WriteFile(trigger, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ended:
	case <-time.After(30 * time.Second):
		t.Fatal("the memory hog in a 32 MiB pod was not killed")
	}
	f.fake.stop(vt.rec.Domain, vm.StopCrashed) // libvirt's reason for a QEMU that died
	select {
	case <-vt.exited:
	case <-time.After(10 * time.Second):
		t.Fatal("exit not recorded")
	}
	if _, _, st, _ := vt.snapshot(); st != oomKilledStatus {
		t.Errorf("exit status %d, want %d", st, oomKilledStatus)
	}
	var order []string
	withLock(&f.events.mu, func() {
		for _, e := range f.events.events {
			switch e.(type) {
			case *eventstypes.TaskOOM:
				order = append(order, "oom")
			case *eventstypes.TaskExit:
				order = append(order, "exit")
			}
		}
	})
	if strings.Join(order, ",") != "oom,exit" {
		t.Errorf("events %v, want TaskOOM then TaskExit", order)
	}

	// The same crash with no OOM kill since Start is libvirt's 255.
	g := newVMFixture(t)
	crashed := g.started()
	g.fake.stop(crashed.rec.Domain, vm.StopCrashed)
	<-crashed.exited
	if _, _, st, _ := crashed.snapshot(); st != vm.StopCrashed.ExitStatus() {
		t.Errorf("crash without a cgroup: exit %d, want %d", st, vm.StopCrashed.ExitStatus())
	}
}

// limitPodMemory sets the pod cgroup's memory limit, as kubelet does.
func limitPodMemory(t *testing.T, hs cgroup.Hierarchies, pod string, bytes int64) {
	t.Helper()
	file := filepath.Join(hs.V1["memory"], pod, "memory.limit_in_bytes")
	if hs.Version() == 2 {
		file = filepath.Join(hs.Unified, pod, "memory.max")
	}
	if err := os.WriteFile(file, []byte(strconv.FormatInt(bytes, 10)), 0); err != nil {
		t.Fatal(err)
	}
	if hs.Version() == 1 {
		_ = os.WriteFile(filepath.Join(hs.V1["memory"], pod, "memory.swappiness"), []byte("0"), 0)
	}
}

// A VM whose pod's memory limit cannot hold its guest RAM plus QEMU's
// measured overhead is refused before anything is made, naming the
// RuntimeClass overhead to declare; with the overhead declared it is made.
func TestCreateRefusesPodWithoutOverhead(t *testing.T) {
	const guest = 256
	for _, c := range []struct {
		podMiB int
		ok     bool
	}{{guest, false}, {guest + PodFixedOverheadMiB - 1, false}, {guest + PodFixedOverheadMiB, true}} {
		f := newVMFixture(t)
		v1 := map[string]string{"memory": t.TempDir(), "cpu": t.TempDir(), "cpuacct": t.TempDir()}
		f.host.cgroups = &cgroup.Hierarchies{V1: v1}
		if err := os.MkdirAll(filepath.Join(v1["memory"], "pod1"), 0o755); err != nil {
			t.Fatal(err)
		}
		limit := strconv.Itoa(c.podMiB << 20)
		if err := os.WriteFile(filepath.Join(v1["memory"], "pod1", "memory.limit_in_bytes"), []byte(limit), 0o644); err != nil {
			t.Fatal(err)
		}
		f.kernelRootfs()
		f.cgroupsPath = "/pod1/vm1"
		mem := int64(guest << 20)
		_, err := f.createSpec(&specs.Spec{Linux: &specs.Linux{Resources: &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: &mem}}}})
		if c.ok {
			if err != nil {
				t.Errorf("pod of %d MiB: %v, want the VM made", c.podMiB, err)
			}
			continue
		}
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), fmt.Sprintf("overhead.podFixed memory: %dMi", PodFixedOverheadMiB)) {
			t.Errorf("pod of %d MiB: %v, want InvalidArgument naming the overhead to declare", c.podMiB, err)
		}
		assertGone(t, filepath.Join(f.bundle, recordFile), filepath.Join(v1["memory"], "pod1", "vm1"), filepath.Join(f.host.cfg.StateDir, "vms"))
	}
}

// A full state directory (ENOSPC, on a real tmpfs of 1 MiB): Create fails
// with the error that names it and leaves nothing in the state dir, the
// bundle, the NUMA and id stores or libvirt; a VM made before the disk
// filled keeps running.
func TestCreateWithAFullStateDir(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a tmpfs")
	}
	f := newVMFixture(t)
	state := t.TempDir()
	if err := unix.Mount("tmpfs", state, "tmpfs", 0, "size=1m"); err != nil {
		t.Skipf("mount a tmpfs: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(state, unix.MNT_DETACH) })
	f.host.cfg.StateDir, f.host.layout = state, layout{root: state}
	running := f.started()

	fill, err := os.Create(filepath.Join(state, "fill"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = fill.Write(make([]byte, 2<<20))
	_ = fill.Close()
	if !errors.Is(err, unix.ENOSPC) {
		t.Fatalf("filling the state dir: %v, want ENOSPC", err)
	}
	g := &vmFixture{t: t, fake: f.fake, host: f.host, events: &eventLog{}, bundle: t.TempDir(), id: "vm2"}
	g.kernelRootfs()
	before, _ := os.ReadDir(filepath.Join(state, "vms"))
	_, err = g.createSpec(&specs.Spec{Annotations: map[string]string{}, Process: &specs.Process{}})
	if err == nil || !strings.Contains(err.Error(), "no space left on device") {
		t.Fatalf("Create with a full state dir: %v, want the ENOSPC named", err)
	}
	t.Logf("Create with a full state dir: %v", err)
	after, _ := os.ReadDir(filepath.Join(state, "vms"))
	if len(after) != len(before) {
		t.Errorf("the state dir's vms went from %d to %d entries", len(before), len(after))
	}
	assertGone(t, filepath.Join(g.bundle, recordFile))
	if n := len(f.fake.doms); n != 1 {
		t.Errorf("%d domains defined, want only the running VM's", n)
	}
	if st, _, _, _ := running.snapshot(); st != task.Status_RUNNING {
		t.Errorf("the VM made before is %s", st)
	}
}
