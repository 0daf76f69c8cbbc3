//go:build integration

package integration

import (
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestHarnessCRI checks that each private containerd loaded CRI with the
// suite's config: CRI answers, and ctr lists the CRI plugins as ok.
func TestHarnessCRI(t *testing.T) {
	s := requireSuite(t)
	s.forEachFlavour(t, func(t *testing.T, c *containerd) {
		cl := c.cri(t)
		ctx, cancel := criCtx()
		defer cancel()
		v, err := cl.Runtime.Version(ctx, &cri.VersionRequest{})
		if err != nil {
			t.Fatalf("CRI Version: %v", err)
		}
		t.Logf("CRI: %s %s, CRI API %s", v.RuntimeName, v.RuntimeVersion, v.RuntimeApiVersion)
		wantPrefix := strings.TrimSuffix(c.Flavour.Name, "x")
		if v.RuntimeName != "containerd" || !strings.HasPrefix(strings.TrimPrefix(v.RuntimeVersion, "v"), wantPrefix) ||
			v.RuntimeApiVersion != "v1" {
			t.Errorf("CRI Version = %+v, want containerd %s* with CRI API v1", v, wantPrefix)
		}

		want := []string{"io.containerd.grpc.v1 cri"}
		if c.Flavour.Name == "2.x" {
			want = append(want, "io.containerd.cri.v1 images", "io.containerd.cri.v1 runtime")
		}
		plugins := c.mustCtr(t, "", "plugins", "ls").Stdout
		for _, w := range want {
			if st := pluginStatus(plugins, w); st != "ok" {
				t.Errorf("plugin %s: status %q, want ok", w, st)
			}
		}
	})
}

// pluginStatus finds "TYPE ID" in `ctr plugins ls` (TYPE ID PLATFORMS STATUS)
// and returns its status.
func pluginStatus(out, typeID string) string {
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) >= 3 && f[0]+" "+f[1] == typeID {
			return f[len(f)-1]
		}
	}
	return "missing"
}

// TestHarnessRuncPause runs the pause image with runc through ctr: it checks
// the harness (containerd, ctr helpers, leftover checks) without the kvm shim.
func TestHarnessRuncPause(t *testing.T) {
	s := requireSuite(t)
	s.requireImages(t, "pause")
	s.forEachFlavour(t, func(t *testing.T, c *containerd) {
		c.cleanupAfter(t)
		id := "it-runc-pause"
		c.mustCtr(t, nsDefault, "run", "-d", "--runtime", runcRuntime, sandboxImage, id)
		c.waitTaskStatus(t, nsDefault, id, "RUNNING", 30*time.Second)
		pids := c.taskPids(t, nsDefault, id)
		if len(pids) != 1 {
			t.Fatalf("ctr task ps %s: pids %v, want one", id, pids)
		}
		if name, err := exe(pids[0]); err != nil || name != "pause" {
			t.Fatalf("task pid %d runs %q (%v), want pause", pids[0], name, err)
		}
		c.mustCtr(t, nsDefault, "task", "pause", id)
		c.waitTaskStatus(t, nsDefault, id, "PAUSED", 30*time.Second)
		c.mustCtr(t, nsDefault, "task", "resume", id)
		c.waitTaskStatus(t, nsDefault, id, "RUNNING", 30*time.Second)
		c.mustCtr(t, nsDefault, "task", "kill", id)
		c.waitTaskStatus(t, nsDefault, id, "STOPPED", 30*time.Second)
		c.deleteTask(t, nsDefault, id, 0)
		c.mustCtr(t, nsDefault, "containers", "delete", id)
		assertNothingLeft(t, c, shimID{nsDefault, id})

		// And SIGKILL: exit status 137.
		c.mustCtr(t, nsDefault, "run", "-d", "--runtime", runcRuntime, sandboxImage, id)
		c.waitTaskStatus(t, nsDefault, id, "RUNNING", 30*time.Second)
		c.mustCtr(t, nsDefault, "task", "kill", "-s", "KILL", id)
		c.waitTaskStatus(t, nsDefault, id, "STOPPED", 30*time.Second)
		c.deleteTask(t, nsDefault, id, 137)
		c.mustCtr(t, nsDefault, "containers", "delete", id)
		assertNothingLeft(t, c, shimID{nsDefault, id})
	})
}

// TestHarnessDetectsLeftovers proves the leftover check can fail: while a
// runc task runs, it must report the container, its bundle, its rootfs
// mount, its shim process and the shim socket; after deletion, nothing.
func TestHarnessDetectsLeftovers(t *testing.T) {
	s := requireSuite(t)
	s.requireImages(t, "pause")
	s.forEachFlavour(t, func(t *testing.T, c *containerd) {
		c.cleanupAfter(t)
		id := shimID{nsDefault, "it-leftover"}
		c.mustCtr(t, nsDefault, "run", "-d", "--runtime", runcRuntime, sandboxImage, id.id)
		c.waitTaskStatus(t, nsDefault, id.id, "RUNNING", 30*time.Second)
		found := strings.Join(c.leftovers([]shimID{id}), "\n")
		for _, want := range []string{
			"containers in namespace default: [it-leftover]",
			"task bundles in " + c.State,
			"mount " + c.State + "/io.containerd.runtime.v2.task/default/it-leftover/rootfs",
			"shim process ",
			"shim socket " + shimSocketPath(c.Address, id),
		} {
			if !strings.Contains(found, want) {
				t.Errorf("leftovers while running lack %q; got:\n%s", want, found)
			}
		}
		c.mustCtr(t, nsDefault, "task", "kill", "-s", "KILL", id.id)
		c.waitTaskStatus(t, nsDefault, id.id, "STOPPED", 30*time.Second)
		c.deleteTask(t, nsDefault, id.id, 137)
		c.mustCtr(t, nsDefault, "containers", "delete", id.id)
		assertNothingLeft(t, c, id)
	})
}

// TestHarnessCRIRunc runs the CRI pod flow of the VM tests with runc and the
// pause image: it checks the CRI and CNI config (pod IP from the private
// subnet), stats, stop and the leftover checks without the kvm shim.
func TestHarnessCRIRunc(t *testing.T) {
	s := requireSuite(t)
	s.requireImages(t, "pause")
	s.forEachFlavour(t, func(t *testing.T, c *containerd) {
		c.cleanupAfter(t)
		cl := c.cri(t)
		v := c.startPodContainer(t, cl, "runc-pod", "runc", sandboxImage)
		cl.waitContainerState(t, v.cid, cri.ContainerState_CONTAINER_RUNNING, 30*time.Second)

		ctx, cancel := criCtx()
		defer cancel()
		st, err := cl.Runtime.PodSandboxStatus(ctx, &cri.PodSandboxStatusRequest{PodSandboxId: v.id})
		if err != nil {
			t.Fatalf("PodSandboxStatus: %v", err)
		}
		_, subnet, _ := net.ParseCIDR(c.Subnet)
		if ip := net.ParseIP(st.Status.GetNetwork().GetIp()); ip == nil || !subnet.Contains(ip) {
			t.Errorf("pod IP %q, want one in %s", st.Status.GetNetwork().GetIp(), c.Subnet)
		}
		want := "pod IP still reserved: " + filepath.Join(c.IPAMDir, cniNetwork, st.Status.GetNetwork().GetIp())
		if found := strings.Join(c.leftovers(nil), "\n"); !strings.Contains(found, want) {
			t.Errorf("leftovers while the pod runs lack %q; got:\n%s", want, found)
		}

		cl.waitStats(t, v.cid)
		if err := cl.stopContainer(v); err != nil {
			t.Fatal(err)
		}
		cl.removePod(t, v)
		assertNothingLeft(t, c, v.shimIDs()...)
	})
}
