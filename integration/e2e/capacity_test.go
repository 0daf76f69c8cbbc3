//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"

	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/testenv"
	"github.com/kvm-shim/containerd-shim-kvm-v1/numa"
)

// capacityVCPUs is the node's vCPU capacity the test sets: cpu_threshold
// is chosen so that the node's CPUs take this many floating vCPUs.
const capacityVCPUs = 2

// TestCapacity: the shim's NUMA capacity reaches the scheduler and
// kubelet through the node installer, so that of N+1 VM pods on a node
// that takes N, N run, one stays Pending with the scheduler's
// "Insufficient kvm.containerd.io/vcpu" and none is refused by the shim
// (no CrashLoopBackOff, no restart); deleting a running one lets the
// Pending one in. One containerd flavour: the agreement is between the
// shim and Kubernetes, the same on either.
//
// The shim's capacity is the host's: it counts every running VM on the
// node, another test run's too. The test starts on a host where no other
// VM runs (quietHost), and a failure names the VMs that ran beside it.
func TestCapacity(t *testing.T) {
	if skipReason != "" {
		t.Skip(skipReason)
	}
	begin := time.Now()
	flavour := strings.TrimSpace(strings.Split(envOr("KVM_IT_FLAVOURS", "1.6,2.x"), ",")[0])
	archives := suite.buildInstallerImages(t)
	quietHost(t)
	ie := suite.startBare(t, flavour, archives)
	want, threshold := capacityPolicy(t)
	cfg, err := os.ReadFile(ie.ctd.ShimConfigPath)
	if err != nil {
		t.Fatal(err)
	}
	const suiteThreshold = "cpu_threshold = 100.0\n"
	if !strings.Contains(string(cfg), suiteThreshold) {
		t.Fatalf("shim config %s lacks %q", ie.ctd.ShimConfigPath, suiteThreshold)
	}
	cfg = []byte(strings.Replace(string(cfg), suiteThreshold, fmt.Sprintf("cpu_threshold = %v\n", threshold), 1))
	if err := os.WriteFile(ie.ctd.ShimConfigPath, cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	rc := filepath.Join(suite.repo, "deploy", "runtimeclass.yaml")
	if _, err := ie.cluster.Kubectl(context.Background(), nil, "apply", "-f", rc); err != nil {
		t.Fatal(err)
	}
	ie.applyInstaller(t, installerVersions[0], "install")
	ie.waitLabel(t, "ready", 3*time.Minute)
	got := ie.allocatableVCPUs(t)
	t.Logf("node ready after %v: cpu_threshold %v, allocatable %s %d", time.Since(begin).Round(time.Second), threshold,
		numa.VCPUResource, got)
	if got != int64(want) {
		t.Fatalf("node allocatable %s = %d, want %d (numa.VCPUCapacity of this host)", numa.VCPUResource, got, want)
	}

	fill := time.Now()
	var names []string
	for i := range want + 1 {
		names = append(names, fmt.Sprintf("cap-%d", i))
		ie.apply(t, pod(podOpts{name: names[i], image: kernelImage, vm: true, probe: echoPort}))
	}
	running, pending := ie.settle(t, names, want)
	t.Logf("%d VM pods: %q Ready, %q Pending, after %v", len(names), running, pending, time.Since(fill).Round(time.Second))

	ie.restartKubelet(t, running)

	// One deleted: the Pending pod is scheduled and runs.
	again := time.Now()
	ie.deletePod(t, running[0])
	ie.waitReady(t, pending[0])
	t.Logf("pod %s Ready %v after %s was deleted", pending[0], time.Since(again).Round(time.Second), running[0])
	for _, n := range append(running[1:], pending[0]) {
		p, err := ie.getPod(n)
		if err != nil {
			t.Fatal(err)
		}
		if c := p.container(); c.RestartCount != 0 || (c.State.Waiting != nil && c.State.Waiting.Reason == "CrashLoopBackOff") {
			t.Errorf("%s: the shim refused a pod kubelet admitted (VMs running on the host: %q)", p, runningVMs(t))
		}
		ie.deletePod(t, n)
	}
	t.Logf("TestCapacity took %v", time.Since(begin).Round(time.Second))
}

// restartKubelet restarts kubelet, which admits its running pods again
// against the node's allocatable: the VM pods keep running (kubelet
// keeps the extended resource it did not make) and the node still
// advertises its capacity.
func (ie *installerEnv) restartKubelet(t *testing.T, running []string) {
	t.Helper()
	before := map[string]string{}
	for _, n := range running {
		p, err := ie.getPod(n)
		if err != nil {
			t.Fatal(err)
		}
		before[n] = p.container().ContainerID
	}
	if err := ie.cluster.RestartKubelet(context.Background()); err != nil {
		t.Fatal(err)
	}
	time.Sleep(15 * time.Second) // a few of kubelet's syncs
	for _, n := range running {
		p := ie.waitReady(t, n)
		if c := p.container(); c.RestartCount != 0 || c.ContainerID != before[n] {
			t.Errorf("%s after kubelet's restart: container %s (was %s)", p, c.ContainerID, before[n])
		}
	}
	if got := ie.allocatableVCPUs(t); got != int64(len(running)) {
		t.Errorf("allocatable %s after kubelet's restart: %d, want %d", numa.VCPUResource, got, len(running))
	}
}

// runningVMs lists the running libvirt domains on the host.
func runningVMs(t *testing.T) []string {
	t.Helper()
	l, err := testenv.ConnectLibvirt()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Disconnect() }()
	doms, _, err := l.ConnectListAllDomains(1, libvirt.ConnectListDomainsActive)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, d := range doms {
		names = append(names, d.Name)
	}
	return names
}

// quietHost waits until no VM runs on the host: the shim counts every
// running VM of the node against its capacity, other test runs' too,
// behind Kubernetes' back. In make test the tiers run one after another,
// so nothing else runs; on a shared host the test waits for a quiet
// moment, up to quietWait.
func quietHost(t *testing.T) {
	t.Helper()
	const quietWait = 15 * time.Minute
	begin := time.Now()
	for {
		vms := runningVMs(t)
		if len(vms) == 0 {
			break
		}
		if time.Since(begin) > quietWait {
			t.Fatalf("VMs of others have run on this host for %v and would take its capacity: %q", quietWait, vms)
		}
		time.Sleep(5 * time.Second)
	}
	if d := time.Since(begin); d > time.Second {
		t.Logf("waited %v for the host's other VMs to end", d.Round(time.Second))
	}
}

// capacityPolicy is the cpu_threshold that gives this host
// capacityVCPUs floating vCPUs, and the capacity the shim computes for it.
func capacityPolicy(t *testing.T) (int, float64) {
	t.Helper()
	topo, err := numa.ReadTopology("/")
	if err != nil {
		t.Fatal(err)
	}
	cpus := 0
	for _, n := range topo.Nodes {
		cpus += len(n.CPUs)
	}
	threshold := float64(capacityVCPUs) / float64(cpus)
	n, err := numa.VCPUCapacity(topo, numa.Policy{CPUThreshold: threshold})
	if err != nil || n < 1 {
		t.Fatalf("capacity of this host at cpu_threshold %v: %d, %v", threshold, n, err)
	}
	return n, threshold
}

// allocatableVCPUs is the node's allocatable kvm.containerd.io/vcpu, once
// kubelet has it.
func (ie *installerEnv) allocatableVCPUs(t *testing.T) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var v int64
	path := `jsonpath={.status.allocatable.kvm\.containerd\.io/vcpu}`
	if err := testenv.Poll(ctx, time.Second, func() (bool, string) {
		out, err := ie.cluster.Kubectl(ctx, nil, "get", "node", nodeName, "-o", path)
		if err != nil {
			return false, err.Error()
		}
		v, err = strconv.ParseInt(strings.TrimSpace(out), 10, 64)
		return err == nil, fmt.Sprintf("%q", out)
	}); err != nil {
		t.Fatalf("node %s never had an allocatable %s: %v", nodeName, numa.VCPUResource, err)
	}
	return v
}

// settle waits until want of the pods are Ready and the others Pending,
// unbound, with the scheduler's Insufficient reason; no pod may restart
// (the shim refusing a pod kubelet admitted) on the way.
func (ie *installerEnv) settle(t *testing.T, names []string, want int) (running, pending []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*bootTimeout)
	defer cancel()
	err := testenv.Poll(ctx, time.Second, func() (bool, string) {
		running, pending = nil, nil
		var states []string
		for _, n := range names {
			p, err := ie.getPod(n)
			if err != nil {
				return false, err.Error()
			}
			if c := p.container(); c.RestartCount != 0 || c.State.Terminated != nil {
				t.Fatalf("%s: the shim refused a pod kubelet admitted (VMs running on the host: %q)", p, runningVMs(t))
			}
			msg := ie.unschedulable(ctx, n)
			switch {
			case p.running() && p.ready():
				running = append(running, n)
			case strings.Contains(msg, "Insufficient "+numa.VCPUResource):
				pending = append(pending, n)
			}
			states = append(states, fmt.Sprintf("%s [%s]", p, msg))
		}
		return len(running) == want && len(pending) == len(names)-want, strings.Join(states, "; ")
	})
	if err != nil {
		t.Fatalf("want %d VM pods Ready and %d Pending for %s: %v", want, len(names)-want, numa.VCPUResource, err)
	}
	return running, pending
}

// unschedulable is the scheduler's message on an unbound pod it found no
// node for, else "".
func (ie *installerEnv) unschedulable(ctx context.Context, name string) string {
	const cond = `{.status.conditions[?(@.type=="PodScheduled")]`
	out, err := ie.cluster.Kubectl(ctx, nil, "get", "pod", name, "-o", "jsonpath={.spec.nodeName}|"+cond+".reason}|"+cond+".message}")
	if err != nil || !strings.HasPrefix(out, "|Unschedulable|") {
		return ""
	}
	return strings.TrimPrefix(out, "|Unschedulable|")
}
