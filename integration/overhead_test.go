//go:build integration

package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/kvm-shim/containerd-shim-kvm-v1/cgroup"
	"github.com/kvm-shim/containerd-shim-kvm-v1/shim"
)

// makePodCgroup makes the pod's cgroup with a memory limit, as kubelet
// does before RunPodSandbox: the containers' limits plus the RuntimeClass
// overhead.
func makePodCgroup(t *testing.T, h cgroup.Hierarchies, parent string, limit int64) {
	t.Helper()
	g, err := h.Group(parent)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.Create(); err != nil {
		t.Fatal(err)
	}
	file := "memory.limit_in_bytes"
	if h.Version() == 2 {
		file = "memory.max"
	}
	dir := g.Dirs()[0]
	if h.Version() == 1 {
		dir = filepath.Join(h.V1["memory"], parent)
	}
	if err := os.WriteFile(filepath.Join(dir, file), []byte(strconv.FormatInt(limit, 10)), 0o644); err != nil {
		t.Fatal(err)
	}
}

// oomKills reads how many processes of the cgroup the kernel's OOM killer
// ended (v1 memory.oom_control, counted in the victim's own cgroup; v2
// memory.events, which counts the whole subtree).
func oomKills(h cgroup.Hierarchies, p string) (int, error) {
	file, dir := "memory.oom_control", filepath.Join(h.V1["memory"], p)
	if h.Version() == 2 {
		file, dir = "memory.events", filepath.Join(h.Unified, p)
	}
	b, err := os.ReadFile(filepath.Join(dir, file))
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "oom_kill "); ok {
			return strconv.Atoi(strings.TrimSpace(v))
		}
	}
	return 0, fmt.Errorf("%s has no oom_kill line", file)
}

// TestCRIOverheadNoOOM runs a 512 MiB VM whose guest touches all of its
// RAM in a pod whose memory limit is the container's limit plus the
// documented RuntimeClass overhead (shim.PodFixedOverheadMiB): QEMU is
// never OOM-killed. As a control, on the first flavour the same guest in
// a pod limited to the guest's RAM alone is OOM-killed: the pod's limit
// does bind the VM.
func TestCRIOverheadNoOOM(t *testing.T) {
	s := requireKVM(t, "kernel", "pause")
	h := hostCgroups(t)
	const guest = 512 << 20
	run := func(t *testing.T, c *containerd, overhead int64, wantKilled bool) {
		cl := c.cri(t)
		parent := c.podCgroup(t, h)
		makePodCgroup(t, h, parent, guest+overhead)
		cfg := containerConfig("vm", s.images["kernel"].ref, map[string]string{"kvm.containerd.io/kernel-cmdline": "console=ttyS0 kvmguest.fill"})
		cfg.Linux.Resources.MemoryLimitInBytes = guest
		v := c.startVMIn(t, cl, "vm-fill", parent, cfg)
		cid := v.cid
		if wantKilled {
			st := cl.waitContainerState(t, cid, cri.ContainerState_CONTAINER_EXITED, 3*bootTimeout)
			// v1 counts the kill in QEMU's cgroup, gone with the task:
			// the pod's failcnt shows its limit was hit.
			hit, err := oomKills(h, parent)
			if h.Version() == 1 {
				var b []byte
				b, err = os.ReadFile(filepath.Join(h.V1["memory"], parent, "memory.failcnt"))
				hit, _ = strconv.Atoi(strings.TrimSpace(string(b)))
			}
			t.Logf("limit guest RAM + %d MiB: the VM exited with %d (%s); the pod's limit was hit %d time(s) (%v)", overhead>>20, st.ExitCode,
				st.Reason, hit, err)
			if st.ExitCode == 0 || hit < 1 {
				t.Errorf("the VM exited with %d and the pod's limit was hit %d time(s): want an OOM kill at the pod's limit", st.ExitCode, hit)
			}
		} else {
			if err := waitLog(v.logPath, "KVM-GUEST-FILLED", 3*bootTimeout); err != nil {
				t.Fatal(err)
			}
			time.Sleep(5 * time.Second)
			if st := cl.containerStatus(t, cid); st.State != cri.ContainerState_CONTAINER_RUNNING {
				t.Errorf("the VM is %s (exit %d, %s) after its guest filled its RAM", st.State, st.ExitCode, st.Reason)
			}
			if n, err := oomKills(h, parent+"/"+cid); err != nil || n != 0 {
				t.Errorf("the VM's cgroup counts %d OOM kill(s) (%v)", n, err)
			}
			g, _ := h.Group(parent + "/" + cid)
			if st, err := g.Stats(); err == nil {
				t.Logf("limit guest RAM + %d MiB: guest %s MiB filled; the VM's cgroup peaked at %d MiB", overhead>>20,
					lastGuestLine(v.logPath, "KVM-GUEST-FILLED"), st.MemoryMaxUsage>>20)
			}
			if err := cl.stopContainer(v); err != nil {
				t.Error(err)
			}
		}
		cl.removePod(t, v)
		assertNothingLeft(t, c, v.shimIDs()...)
	}
	s.forEachFlavour(t, func(t *testing.T, c *containerd) {
		c.cleanupAfter(t)
		t.Run("documented overhead", func(t *testing.T) { run(t, c, shim.PodFixedOverheadMiB<<20, false) })
		if c == s.flavours[0] {
			t.Run("no overhead", func(t *testing.T) { run(t, c, 0, true) })
		}
	})
}
