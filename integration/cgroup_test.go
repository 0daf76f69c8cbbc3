//go:build integration

package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/kvm-shim/containerd-shim-kvm-v1/cgroup"
)

// hostCgroups returns this host's cgroup hierarchies.
func hostCgroups(t *testing.T) cgroup.Hierarchies {
	t.Helper()
	h, err := cgroup.Detect()
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// podCgroup names a pod cgroup as kubelet's cgroupfs driver does, and
// removes it with everything below it when the test ends (kubelet's job).
func (c *containerd) podCgroup(t *testing.T, h cgroup.Hierarchies) string {
	parent := fmt.Sprintf("/kvm-it/burstable/pod-%s-%d", c.Flavour.Name, time.Now().UnixNano())
	t.Cleanup(func() { removeCgroupTree(t, h, parent) })
	return parent
}

// removeCgroupTree removes dir and what is below it in every hierarchy,
// deepest first (kubelet's job for a pod cgroup; the shim removes only
// the container's).
func removeCgroupTree(t *testing.T, h cgroup.Hierarchies, p string) {
	t.Helper()
	g, err := h.Group(p)
	if err != nil {
		t.Error(err)
		return
	}
	for _, d := range g.Dirs() {
		var dirs []string
		_ = filepath.WalkDir(d, func(path string, e os.DirEntry, err error) error {
			if err == nil && e.IsDir() {
				dirs = append(dirs, path)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			if err := os.Remove(dirs[i]); err != nil && !os.IsNotExist(err) {
				t.Errorf("remove cgroup %s: %v", dirs[i], err)
			}
		}
	}
}

// procCgroups maps each hierarchy's controllers ("cpu", "memory,..."
// split) to the path /proc/<pid>/task/<tid>/cgroup gives.
func procCgroups(pid, tid int) (map[string]string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/cgroup", pid, tid))
	if err != nil {
		return nil, err
	}
	m := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.SplitN(l, ":", 3)
		if len(f) != 3 {
			continue
		}
		for _, c := range strings.Split(f[1], ",") {
			m[c] = f[2]
		}
		if f[1] == "" {
			m["unified"] = f[2]
		}
	}
	return m, nil
}

// checkThreadsInCgroup checks that QEMU and every one of its threads sit
// in want for the controllers that charge the pod.
func checkThreadsInCgroup(t *testing.T, h cgroup.Hierarchies, pid int, want string) {
	t.Helper()
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		t.Fatal(err)
	}
	ctrls := cgroup.V1Controllers
	if h.Version() == 2 {
		ctrls = []string{"unified"}
	}
	for _, e := range tasks {
		tid, _ := strconv.Atoi(e.Name())
		m, err := procCgroups(pid, tid)
		if err != nil {
			t.Errorf("thread %d: %v", tid, err)
			continue
		}
		name, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/comm", pid, tid))
		for _, c := range ctrls {
			if c != "unified" && h.V1[c] == "" {
				continue
			}
			if m[c] != want {
				t.Errorf("QEMU pid %d thread %d (%s) is in %s cgroup %q, want the container's %q", pid, tid, strings.TrimSpace(string(name)), c, m[c],
					want)
			}
		}
	}
	t.Logf("QEMU pid %d: %d threads, all in %s", pid, len(tasks), want)
}

// checkPagesOnNodes reads QEMU's numa_maps: every page counted on a node
// ("N<node>=<pages>") must be on one of nodes.
func checkPagesOnNodes(t *testing.T, pid int, nodes string) {
	t.Helper()
	allowed, err := cpuList(nodes)
	if err != nil {
		t.Fatal(err)
	}
	maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/numa_maps", pid))
	if err != nil {
		t.Fatal(err)
	}
	pages := 0
	for _, f := range strings.Fields(string(maps)) {
		node, count, ok := strings.Cut(strings.TrimPrefix(f, "N"), "=")
		if !strings.HasPrefix(f, "N") || !ok {
			continue
		}
		n, err1 := strconv.Atoi(node)
		k, err2 := strconv.Atoi(count)
		if err1 != nil || err2 != nil {
			continue
		}
		pages += k
		if !slices.Contains(allowed, n) {
			t.Errorf("QEMU pid %d has %d pages on node %d, outside its numatune nodeset %s", pid, k, n, nodes)
		}
	}
	if pages == 0 {
		t.Errorf("numa_maps of QEMU pid %d counts no pages on any node", pid)
	}
}

// virtiofsdServing lists the virtiofsd processes whose command line
// serves dir (libvirt passes it as -o source=<dir>).
func virtiofsdServing(t *testing.T, dir string) []int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
		cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if strings.Contains(filepath.Base(exe), "virtiofsd") && strings.Contains(string(cmd), "source="+dir) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// startVMIn runs a pod in the cgroup parent and starts a VM container of
// cfg in it (CreateContainer, then StartContainer, like kubelet).
func (c *containerd) startVMIn(t *testing.T, cl *criClient, name, parent string, cfg *cri.ContainerConfig) *podContainer {
	t.Helper()
	return cl.startContainerIn(t, c.runPodIn(t, cl, name, "kvm", nil, parent), cfg)
}

// TestCRIPodCgroup runs a VM pod through CRI with a pod cgroup parent, as
// kubelet's cgroupfs driver sets it, on both containerd flavours: QEMU
// and all its threads are charged to the container's cgroup below the pod
// (memory, cpu, cpuacct, pids), NUMA binding and vCPU affinity still hold,
// ContainerStats reads that cgroup, and removing the container removes
// its cgroup.
func TestCRIPodCgroup(t *testing.T) {
	s := requireKVM(t, "kernel", "pause")
	h := hostCgroups(t)
	s.forEachFlavour(t, func(t *testing.T, c *containerd) {
		parent := c.podCgroup(t, h) // removed after the pods: cleanups run last first
		c.cleanupAfter(t)
		cl := c.cri(t)
		// A share: libvirt starts a virtiofsd for it, which the shim
		// charges to the pod too.
		share := t.TempDir()
		cfg := containerConfig("vm", s.images["kernel"].ref, nil)
		cfg.Mounts = []*cri.Mount{{ContainerPath: "/shared", HostPath: share}}
		v := c.startVMIn(t, cl, "vm-cgroup", parent, cfg)
		cid := v.cid
		want := parent + "/" + cid
		g, err := h.Group(want)
		if err != nil {
			t.Fatal(err)
		}
		if err = waitLog(v.logPath, readyLine, bootTimeout); err != nil {
			t.Fatal(err)
		}
		_, pid, err := c.taskStatus(nsCRI, cid)
		if err != nil || pid <= 0 {
			t.Fatalf("QEMU pid %d: %v", pid, err)
		}
		checkThreadsInCgroup(t, h, pid, want)
		fsd := virtiofsdServing(t, share)
		if len(fsd) == 0 {
			t.Fatalf("no virtiofsd serves %s", share)
		}
		for _, p := range fsd {
			checkThreadsInCgroup(t, h, p, want)
		}
		procs, err := g.Procs()
		slices.Sort(procs)
		wantProcs := slices.Sorted(slices.Values(append([]int{pid}, fsd...)))
		if err != nil || !slices.Equal(procs, wantProcs) {
			t.Errorf("the container's cgroup holds %v (%v), want QEMU %d and its virtiofsd %v", procs, err, pid, fsd)
		}

		// NUMA binding and vCPU affinity survive the move.
		d := c.domainOf(t, cid)
		checkNUMATune(t, d, pid)
		for _, tid := range vcpuThreads(t, pid, d.vcpus()) {
			checkAffinity(t, pid, tid, "vCPU thread", d.VCPU.CPUSet)
		}
		checkPagesOnNodes(t, pid, d.NUMATune.Memory.NodeSet)

		// ContainerStats is the cgroup's view: QEMU with its overhead,
		// at least QEMU's resident anonymous memory.
		rss, err := procStatus(pid, 0, "RssAnon")
		if err != nil {
			t.Fatal(err)
		}
		rssKiB, _ := strconv.ParseUint(strings.Fields(rss)[0], 10, 64)
		st := cl.waitStats(t, cid)
		stats, err := g.Stats()
		if err != nil {
			t.Fatal(err)
		}
		if ws := st.Memory.WorkingSetBytes.Value; ws < rssKiB*1024*9/10 || ws > stats.MemoryMaxUsage {
			t.Errorf("ContainerStats working set %d bytes; QEMU's RssAnon is %d KiB and the cgroup's peak %d bytes", ws, rssKiB,
				stats.MemoryMaxUsage)
		}
		if cpu := st.Cpu.UsageCoreNanoSeconds.Value; cpu > stats.CPUUsageNs+uint64(time.Second) {
			t.Errorf("ContainerStats CPU %d ns is more than the cgroup's %d ns read after it", cpu, stats.CPUUsageNs)
		}

		if err := cl.stopContainer(v); err != nil {
			t.Fatal(err)
		}
		cl.removePod(t, v)
		assertNothingLeft(t, c, v.shimIDs()...)
		for _, d := range g.Dirs() {
			if _, err := os.Stat(d); !os.IsNotExist(err) {
				t.Errorf("after RemoveContainer: the container's cgroup %s is left (%v)", d, err)
			}
		}
	})
}
