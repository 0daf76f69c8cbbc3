//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/kube"
	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/testenv"
)

// The second node of TestInstaller's cluster: a node without the shim,
// as in a cluster where only some nodes can run VMs. It has its own
// containerd (no kvm runtime, no shim on its PATH), kubelet, root dir,
// cgroup root, name and address, on the first node's apiserver and
// scheduler, and is registered with installOptOut so that the installer's
// DaemonSet leaves it alone (docs/install-cluster.md#mixed-clusters).
const (
	node2Name       = "kvm-e2e-node2"
	node2CgroupRoot = "/kvm-shim-e2e-node2"
	node2Bridge     = "kvme2e2"
	node2Subnet     = "10.89.19.0/24"
	// Beside the first node's 20248-20257 (internal/kube.DefaultPorts).
	node2KubeletPort, node2KubeletHealthzPort = 20260, 20261
	// installOptOut is the label deploy/installer.yaml's node affinity
	// skips.
	installOptOutKey, installOptOutValue = "kvm.containerd.io/install", "false"
)

var node2IP = net.IPv4(10, 89, 15, 2)

// secondNode is the second node's containerd, started in the background
// while the first node's starts, and what the test recorded of it to
// check that nothing of it is left.
type secondNode struct {
	dir     string
	started time.Duration // its containerd's start and image import
	ready   chan struct{} // closed once the start ended; then ctd and err are set
	ctd     *testenv.Containerd
	err     error

	tasks       []hostProcess // its pod's processes
	netnsMounts []string      // where its pod's network namespace was mounted
	// cost is the wall time the node adds to the test, by step: what the
	// test waits for because of it (its start runs beside the first
	// node's, so only the lag of its readiness counts).
	cost []stepCost
}

type stepCost struct {
	step string
	d    time.Duration
}

// timed measures a step the second node adds; call the result at its end.
func (n *secondNode) timed(step string) func() {
	begin := time.Now()
	return func() { n.cost = append(n.cost, stepCost{step, time.Since(begin)}) }
}

func (n *secondNode) logCost(t *testing.T) {
	var total time.Duration
	var parts []string
	for _, c := range n.cost {
		total += c.d
		parts = append(parts, fmt.Sprintf("%s %s", c.step, c.d.Round(100*time.Millisecond)))
	}
	t.Logf("the second node added about %s: %s", total.Round(100*time.Millisecond), strings.Join(parts, ", "))
}

// readyAfterFirst records how much later than the first node the second
// became Ready: what the cluster's start waited for it.
func (n *secondNode) readyAfterFirst(t *testing.T, e *env) {
	t.Helper()
	ready := map[string]time.Time{}
	out := e.kubectl(t, "get", "nodes", "-o",
		`jsonpath={range .items[*]}{.metadata.name} {.status.conditions[?(@.type=="Ready")].lastTransitionTime}{"\n"}{end}`)
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if f := strings.Fields(line); len(f) == 2 {
			ready[f[0]], _ = time.Parse(time.RFC3339, f[1])
		}
	}
	lag := ready[node2Name].Sub(ready[nodeName])
	t.Logf("nodes Ready at %v (second node %s after the first)", ready, lag)
	if lag > 0 {
		n.cost = append(n.cost, stepCost{"Ready after the first node", lag})
	}
}

// startNode2 starts the second node's containerd and imports the pause
// image (its runc pods' and sandboxes' image) in the background.
func startNode2(f testenv.Flavour, dir string) *secondNode {
	n := &secondNode{dir: dir, ready: make(chan struct{})}
	go func() {
		defer close(n.ready)
		begin := time.Now()
		ctx := context.Background()
		n.ctd, n.err = testenv.Start(ctx, f, testenv.Options{
			Dir: filepath.Join(dir, "containerd"), SandboxImage: pauseImage, Bridge: node2Bridge, Subnet: node2Subnet,
			LogLevel: "info", StartTimeout: 90 * time.Second, NoKVMRuntime: true,
		})
		if n.err == nil {
			_, n.err = n.ctd.Import(ctx, filepath.Join(suite.imagesDir, "pause.tar"), testenv.NamespaceCRI)
		}
		n.started = time.Since(begin)
	}()
	return n
}

// wait waits for the start and returns the node for the cluster.
func (n *secondNode) wait() (kube.Node, error) {
	<-n.ready
	if n.err != nil {
		return kube.Node{}, fmt.Errorf("second node: %w", n.err)
	}
	return kube.Node{
		Name: node2Name, IP: node2IP, CRISocket: n.ctd.Address, Dir: filepath.Join(n.dir, "kube"), CgroupRoot: node2CgroupRoot,
		Labels:      map[string]string{installOptOutKey: installOptOutValue},
		KubeletPort: node2KubeletPort, KubeletHealthzPort: node2KubeletHealthzPort,
	}, nil
}

// watchNode2 records every pod ever bound to the second node, with its
// runtime class, until the test ends.
func (ie *installerEnv) watchNode2(t *testing.T) *stream {
	t.Helper()
	return ie.startStream(t, false, "get", "pods", "--all-namespaces", "--watch", "--field-selector", "spec.nodeName="+node2Name,
		"--no-headers", "-o", "custom-columns=NS:.metadata.namespace,NAME:.metadata.name,CLASS:.spec.runtimeClassName")
}

// assertNoVMOnNode2 checks what the watch saw: the runc pod the test put
// there (the watch works), and no VM pod and no installer pod ever.
func assertNoVMOnNode2(t *testing.T, w *stream, runcPod string) {
	t.Helper()
	w.waitMatch(t, "the runc pod "+runcPod, shortTimeout, func(out string) (string, bool) {
		return "", boundToNode2(out)["default/"+runcPod] != ""
	})
	bound := boundToNode2(w.output())
	for pod, class := range bound {
		if class == "kvm" || strings.HasPrefix(pod, "kube-system/kvm-shim-installer") {
			t.Errorf("pod %s (runtime class %s) was bound to %s, the node without the shim", pod, class, node2Name)
		}
	}
	t.Logf("pods ever bound to %s: %v", node2Name, bound)
}

// boundToNode2 reads the watch's rows: namespace/name -> runtime class.
func boundToNode2(out string) map[string]string {
	bound := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) == 3 && !strings.HasPrefix(line, "No resources") {
			bound[f[0]+"/"+f[1]] = f[2]
		}
	}
	return bound
}

// spreadRuncPods are two runc pods that may not share a node: the
// scheduler has to use both nodes.
func spreadRuncPods() (names []string, pods []any) {
	for _, name := range []string{"runc-1", "runc-2"} {
		p := pod(podOpts{name: name, image: pauseImage, labels: obj{"app": "runc-spread"}})
		p["spec"].(obj)["affinity"] = obj{"podAntiAffinity": obj{"requiredDuringSchedulingIgnoredDuringExecution": []obj{{
			"labelSelector": obj{"matchLabels": obj{"app": "runc-spread"}}, "topologyKey": "kubernetes.io/hostname"}}}}
		names, pods = append(names, name), append(pods, p)
	}
	return names, pods
}

// checkRuncOnBothNodes waits for the spread runc pods, checks they run one
// on each node, records the second node's pod's network namespace and
// deletes them. It returns the name of the pod on the second node.
func (ie *installerEnv) checkRuncOnBothNodes(t *testing.T, names []string) string {
	t.Helper()
	on := map[string]string{}
	for _, name := range names {
		p := ie.waitPod(t, name, bootTimeout, "Running", func(p *podStatus) bool { return p.running() })
		on[p.Spec.NodeName] = name
	}
	if on[nodeName] == "" || on[node2Name] == "" {
		t.Fatalf("runc pods on %v, want one on %s and one on %s", on, nodeName, node2Name)
	}
	t.Logf("runc pods run on both nodes: %v", on)
	ie.node2.recordTasks(t)
	ie.kubectl(t, "delete", "pod", "--wait=false", names[0], names[1])
	return on[node2Name]
}

// recordTasks notes the second node's running task processes (its
// pod's sandbox and container) by pid and start time, and where their
// network namespace is mounted (a path named after a random id): after
// the test none of them may be there. Namespace inode numbers are no
// identity: the kernel reuses them at once for the host's next netns.
func (n *secondNode) recordTasks(t *testing.T) {
	t.Helper()
	r := n.ctd.Ctr(context.Background(), testenv.NamespaceCRI, "task", "ls")
	if r.Err != nil {
		t.Fatal(r)
	}
	netns := map[string]bool{}
	for _, line := range strings.Split(r.Stdout, "\n")[1:] {
		f := strings.Fields(line)
		if len(f) < 3 || f[2] != "RUNNING" {
			continue
		}
		pid, err := strconv.Atoi(f[1])
		if err != nil {
			t.Fatalf("ctr task ls: %q", line)
		}
		ns, err := os.Readlink(filepath.Join("/proc", f[1], "ns", "net"))
		if err != nil {
			t.Fatal(err)
		}
		n.tasks = append(n.tasks, hostProcess{pid, processStart(pid)})
		netns[ns] = true
	}
	for _, m := range mounts() {
		if netns[m.root] {
			n.netnsMounts = append(n.netnsMounts, m.point)
		}
	}
	if len(n.tasks) == 0 || len(n.netnsMounts) == 0 {
		t.Fatalf("on %s: tasks %v, network namespace mounts %v; want some of each:\n%s", node2Name, n.tasks, n.netnsMounts, r.Stdout)
	}
}

// hostProcess is a process by pid and start time (field 22 of
// /proc/<pid>/stat), which a reused pid does not share.
type hostProcess struct {
	pid   int
	start string
}

func processStart(pid int) string {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return ""
	}
	// The command (field 2) is in parentheses and may hold spaces.
	_, rest, _ := strings.Cut(string(b), ") ")
	if f := strings.Fields(rest); len(f) > 19 {
		return f[19]
	}
	return ""
}

type mount struct{ root, point string }

// mounts lists this mount namespace's mounts: for a bind mount of a
// namespace, its root is the namespace ("net:[inode]").
func mounts() []mount {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var ms []mount
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 {
			ms = append(ms, mount{f[3], f[4]})
		}
	}
	return ms
}

// drainNode2 deletes what is left on the second node and waits until its
// containerd holds nothing; before the cluster stops.
func (ie *installerEnv) drainNode2(t *testing.T) {
	ctx := context.Background()
	if _, err := ie.cluster.Kubectl(ctx, nil, "delete", "pods", "-n", "default", "--field-selector", "spec.nodeName="+node2Name,
		"--wait=true", "--timeout=2m"); err != nil {
		t.Errorf("delete the pods on %s: %v", node2Name, err)
	}
	if left := ie.node2.ctd.WaitNothingLeft(ctx, sandboxGCTimeout); len(left) > 0 {
		t.Errorf("left on %s once every pod was deleted:\n  %s", node2Name, strings.Join(left, "\n  "))
	}
}

// stop stops the second node's containerd, once the cluster (and so its
// kubelet) stopped, and checks that nothing of the node is left on the
// host: processes, mounts, cgroups, network namespaces, its bridge and
// address, its directory.
func (n *secondNode) stop(t *testing.T) {
	if n.ctd != nil {
		if t.Failed() {
			t.Logf("containerd of %s log (tail):\n%s", node2Name, n.ctd.LogTail(0, 40))
		}
		if removed := n.ctd.ForceCleanup(context.Background()); len(removed) > 0 {
			t.Errorf("%s: had to remove: %v", node2Name, removed)
		}
		if err := n.ctd.Stop(); err != nil {
			t.Errorf("stop containerd of %s: %v", node2Name, err)
		}
	}
	for _, left := range n.leftovers() {
		t.Errorf("left of %s: %s", node2Name, left)
	}
}

func (n *secondNode) leftovers() []string {
	var left []string
	// Its containerd, kubelet and shims all name the node's directory.
	for _, p := range testenv.ProcessesMatching(func(args []string) bool { return strings.Contains(strings.Join(args, " "), n.dir) }) {
		left = append(left, fmt.Sprintf("process %d: %s", p.Pid, p.Cmdline))
	}
	for _, m := range testenv.MountsUnder(n.dir) {
		left = append(left, "mount "+m)
	}
	for _, d := range kube.CgroupDirs(node2CgroupRoot) {
		left = append(left, "cgroup "+d)
	}
	for _, p := range n.tasks {
		if start := processStart(p.pid); start != "" && start == p.start {
			left = append(left, fmt.Sprintf("pod process %d", p.pid))
		}
	}
	for _, m := range mounts() {
		if slices.Contains(n.netnsMounts, m.point) {
			left = append(left, "network namespace mounted at "+m.point)
		}
	}
	for _, p := range n.netnsMounts {
		if _, err := os.Lstat(p); err == nil {
			left = append(left, "network namespace file "+p)
		}
	}
	if _, err := os.Stat(filepath.Join("/sys/class/net", node2Bridge)); err == nil {
		left = append(left, "link "+node2Bridge)
	}
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && ipn.IP.Equal(node2IP) {
				left = append(left, "address "+node2IP.String())
			}
		}
	}
	if err := os.RemoveAll(n.dir); err != nil {
		left = append(left, fmt.Sprintf("directory %s: %v", n.dir, err))
	}
	return left
}
