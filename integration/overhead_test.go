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

// oomKills reads how many processes of the cgroup at p the kernel's OOM
// killer ended (cgroup.Group.OOMKills).
func oomKills(h cgroup.Hierarchies, p string) (uint64, error) {
	g, err := h.Group(p)
	if err != nil {
		return 0, err
	}
	return g.OOMKills()
}

// TestCRIOverheadNoOOM runs a 512 MiB VM whose guest touches all of its
// RAM in a pod whose memory limit is the container's limit plus the
// documented RuntimeClass overhead (shim.PodFixedOverheadMiB): QEMU is
// never OOM-killed. On the first flavour, two controls: a pod limited to
// the guest's RAM alone is refused at StartContainer (where containerd
// creates the task), naming the overhead
// to declare; and a VM whose pod limit drops to the guest's RAM after it
// started (what a sidecar eating the pod's memory does) is killed by the
// kernel as its guest fills its RAM, which CRI reports as OOMKilled, exit
// 137, as for a runc container.
func TestCRIOverheadNoOOM(t *testing.T) {
	s := requireKVM(t, "kernel", "pause")
	h := hostCgroups(t)
	const guest = 512 << 20
	cfgFor := func() *cri.ContainerConfig {
		cfg := containerConfig("vm", s.images["kernel"].ref, map[string]string{"kvm.containerd.io/kernel-cmdline": "console=ttyS0 kvmguest.fill"})
		cfg.Linux.Resources.MemoryLimitInBytes = guest
		return cfg
	}
	fills := func(t *testing.T, c *containerd) {
		cl := c.cri(t)
		parent := c.podCgroup(t, h)
		makePodCgroup(t, h, parent, guest+shim.PodFixedOverheadMiB<<20)
		v := c.startVMIn(t, cl, "vm-fill", parent, cfgFor())
		if err := waitLog(v.logPath, "KVM-GUEST-FILLED", 3*bootTimeout); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Second)
		if st := cl.containerStatus(t, v.cid); st.State != cri.ContainerState_CONTAINER_RUNNING {
			t.Errorf("the VM is %s (exit %d, %s) after its guest filled its RAM", st.State, st.ExitCode, st.Reason)
		}
		if n, err := oomKills(h, parent+"/"+v.cid); err != nil || n != 0 {
			t.Errorf("the VM's cgroup counts %d OOM kill(s) (%v)", n, err)
		}
		g, _ := h.Group(parent + "/" + v.cid)
		if st, err := g.Stats(); err == nil {
			t.Logf("limit guest RAM + %d MiB: guest %s MiB filled; the VM's cgroup peaked at %d MiB", shim.PodFixedOverheadMiB,
				lastGuestLine(v.logPath, "KVM-GUEST-FILLED"), st.MemoryMaxUsage>>20)
		}
		if err := cl.stopContainer(v); err != nil {
			t.Error(err)
		}
		cl.removePod(t, v)
		assertNothingLeft(t, c, v.shimIDs()...)
	}
	refused := func(t *testing.T, c *containerd) {
		cl := c.cri(t)
		parent := c.podCgroup(t, h)
		makePodCgroup(t, h, parent, guest)
		p := c.runPodIn(t, cl, "vm-no-overhead", "kvm", nil, parent)
		cid, err := cl.createContainer(p, cfgFor())
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := criCtx()
		defer cancel()
		_, err = cl.Runtime.StartContainer(ctx, &cri.StartContainerRequest{ContainerId: cid})
		want := fmt.Sprintf("overhead.podFixed memory: %dMi", shim.PodFixedOverheadMiB)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("StartContainer in a pod limited to the guest's RAM: %v, want a refusal naming %q", err, want)
		}
		cl.removePod(t, &podContainer{pod: p, cid: cid})
		assertNothingLeft(t, c, shimID{nsCRI, p.id})
	}
	oomKilled := func(t *testing.T, c *containerd) {
		cl := c.cri(t)
		parent := c.podCgroup(t, h)
		makePodCgroup(t, h, parent, guest+shim.PodFixedOverheadMiB<<20)
		v := c.startVMIn(t, cl, "vm-oom", parent, cfgFor())
		makePodCgroup(t, h, parent, guest) // a sidecar took the overhead
		st := cl.waitContainerState(t, v.cid, cri.ContainerState_CONTAINER_EXITED, 3*bootTimeout)
		t.Logf("pod limit lowered to the guest's RAM: the VM exited with %d (%s)", st.ExitCode, st.Reason)
		if st.ExitCode != 137 || st.Reason != "OOMKilled" {
			t.Errorf("the VM exited with %d (%s), want 137 (OOMKilled)", st.ExitCode, st.Reason)
		}
		cl.removePod(t, v)
		assertNothingLeft(t, c, v.shimIDs()...)
	}
	s.forEachFlavour(t, func(t *testing.T, c *containerd) {
		c.cleanupAfter(t)
		t.Run("documented overhead", func(t *testing.T) { fills(t, c) })
		if c == s.flavours[0] {
			t.Run("no overhead", func(t *testing.T) { refused(t, c) })
			t.Run("OOM killed", func(t *testing.T) { oomKilled(t, c) })
		}
	})
}
