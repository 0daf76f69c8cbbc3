//go:build integration

package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/testenv"
)

// criTimeout bounds one CRI call; StopContainer adds its own grace period.
const criTimeout = 2 * time.Minute

// criPodNamespace is the Kubernetes namespace of the pods the suite makes
// on its first containerd; podNamespace names the others'.
const criPodNamespace = "kvm-it"

// podNamespace is the Kubernetes namespace of this containerd's pods:
// criPodNamespace for the first flavour, criPodNamespace<k> for the
// flavour with index k. The domains of a pod are named after it
// (kvm-<namespace>-...), and isOwnDomain tells a flavour's own traces (host
// ids, NUMA reservations, descriptor sockets) by that prefix: with one
// namespace for all, a flavour's leftover check would count the VMs of
// another that runs at the same time (forEachFlavourAtOnce).
func (c *containerd) podNamespace() string {
	if k := c.flavourIndex(); k > 0 {
		return fmt.Sprintf("%s%d", criPodNamespace, k)
	}
	return criPodNamespace
}

// criClient talks CRI to one private containerd, as kubelet would; the
// suite's calls return CRI's own gRPC errors, whose codes tests check.
type criClient struct{ *testenv.CRI }

// cri returns a CRI client closed at the end of t.
func (c *containerd) cri(t *testing.T) *criClient {
	t.Helper()
	cl, err := c.DialCRI()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	return &criClient{cl}
}

func criCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), criTimeout)
}

// pod is one CRI pod sandbox created by a test.
type pod struct {
	id     string
	config *cri.PodSandboxConfig
	logDir string
}

// runPod runs a pod sandbox with the given runtime handler; its log
// directory lives in this containerd's directory.
func (c *containerd) runPod(t *testing.T, cl *criClient, name, handler string, annotations map[string]string) *pod {
	t.Helper()
	return c.runPodFull(t, cl, name, handler, annotations, nil, "")
}

// runPodWith is runPod with the pod's DNS configuration (nil: the host's).
func (c *containerd) runPodWith(t *testing.T, cl *criClient, name, handler string, annotations map[string]string, dns *cri.DNSConfig) *pod {
	t.Helper()
	return c.runPodFull(t, cl, name, handler, annotations, dns, "")
}

// runPodIn is runPod with the pod's cgroup parent, as kubelet passes it
// ("" for none).
func (c *containerd) runPodIn(t *testing.T, cl *criClient, name, handler string, annotations map[string]string, cgroupParent string) *pod {
	t.Helper()
	return c.runPodFull(t, cl, name, handler, annotations, nil, cgroupParent)
}

// runPodFull runs a pod with its DNS configuration (nil: the host's) and
// cgroup parent ("" for none).
func (c *containerd) runPodFull(t *testing.T, cl *criClient, name, handler string, annotations map[string]string, dns *cri.DNSConfig,
	cgroupParent string) *pod {
	t.Helper()
	uid := fmt.Sprintf("%s-%d", name, time.Now().UnixNano())
	logDir := filepath.Join(c.Dir, "pods", uid)
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := &cri.PodSandboxConfig{
		Metadata:     &cri.PodSandboxMetadata{Name: name, Namespace: c.podNamespace(), Uid: uid},
		Hostname:     name,
		LogDirectory: logDir,
		Labels:       map[string]string{"app": name},
		Annotations:  annotations,
		DnsConfig:    dns,
		Linux:        &cri.LinuxPodSandboxConfig{CgroupParent: cgroupParent},
	}
	ctx, cancel := criCtx()
	defer cancel()
	resp, err := cl.Runtime.RunPodSandbox(ctx, &cri.RunPodSandboxRequest{Config: cfg, RuntimeHandler: handler})
	if err != nil {
		t.Fatalf("RunPodSandbox %s (handler %s): %v", name, handler, err)
	}
	return &pod{id: resp.PodSandboxId, config: cfg, logDir: logDir}
}

// containerConfig is a VM container of image with a 256Mi memory limit.
func containerConfig(name, image string, annotations map[string]string) *cri.ContainerConfig {
	return &cri.ContainerConfig{
		Metadata:    &cri.ContainerMetadata{Name: name},
		Image:       &cri.ImageSpec{Image: image},
		LogPath:     name + "/0.log",
		Annotations: annotations,
		Linux: &cri.LinuxContainerConfig{
			Resources: &cri.LinuxContainerResources{MemoryLimitInBytes: 256 << 20},
		},
	}
}

// createContainer creates cfg in pod p; like kubelet, it first makes the
// container's log directory.
func (cl *criClient) createContainer(p *pod, cfg *cri.ContainerConfig) (string, error) {
	if err := os.MkdirAll(filepath.Join(p.logDir, filepath.Dir(cfg.LogPath)), 0o755); err != nil {
		return "", err
	}
	ctx, cancel := criCtx()
	defer cancel()
	resp, err := cl.Runtime.CreateContainer(ctx, &cri.CreateContainerRequest{
		PodSandboxId: p.id, Config: cfg, SandboxConfig: p.config,
	})
	if err != nil {
		return "", err
	}
	return resp.ContainerId, nil
}

func (cl *criClient) containerStatus(t *testing.T, id string) *cri.ContainerStatus {
	t.Helper()
	ctx, cancel := criCtx()
	defer cancel()
	resp, err := cl.Runtime.ContainerStatus(ctx, &cri.ContainerStatusRequest{ContainerId: id})
	if err != nil {
		t.Fatalf("ContainerStatus %s: %v", id, err)
	}
	return resp.Status
}

// waitContainerState polls ContainerStatus until the container is in state.
func (cl *criClient) waitContainerState(t *testing.T, id string, state cri.ContainerState, timeout time.Duration) *cri.ContainerStatus {
	t.Helper()
	var st *cri.ContainerStatus
	if err := poll(timeout, func() (bool, string) {
		st = cl.containerStatus(t, id)
		return st.State == state, fmt.Sprintf("container %s is %s (%s %s), want %s", id, st.State, st.Reason, st.Message, state)
	}); err != nil {
		t.Fatal(err)
	}
	return st
}

// stopAndRemovePod stops and removes a sandbox and everything in it.
func (cl *criClient) stopAndRemovePod(t *testing.T, p *pod) {
	t.Helper()
	ctx, cancel := criCtx()
	defer cancel()
	if _, err := cl.Runtime.StopPodSandbox(ctx, &cri.StopPodSandboxRequest{PodSandboxId: p.id}); err != nil {
		t.Errorf("StopPodSandbox %s: %v", p.id, err)
	}
	if _, err := cl.Runtime.RemovePodSandbox(ctx, &cri.RemovePodSandboxRequest{PodSandboxId: p.id}); err != nil {
		t.Errorf("RemovePodSandbox %s: %v", p.id, err)
	}
}

// waitLog waits until the CRI log file at path contains want.
func waitLog(path, want string, timeout time.Duration) error {
	return poll(timeout, func() (bool, string) {
		b, err := os.ReadFile(path)
		if err != nil {
			return false, err.Error()
		}
		return strings.Contains(string(b), want), fmt.Sprintf("%s has no %q; tail:\n%s", path, want, testenv.Tail(string(b), 20))
	})
}

// criStopGrace is the grace period kubelet would pass to StopContainer.
const criStopGrace = 30

// podContainer is a pod with one started container, made through CRI.
type podContainer struct {
	*pod
	cid     string
	logPath string
}

// startPodContainer runs a pod sandbox with the runtime handler and starts
// a container of image in it.
func (c *containerd) startPodContainer(t *testing.T, cl *criClient, name, handler, image string) *podContainer {
	t.Helper()
	return c.startPodContainerWith(t, cl, name, handler, image, nil)
}

// startPodContainerWith is startPodContainer with pod annotations (CRI
// passes those listed in pod_annotations on to the container's spec).
func (c *containerd) startPodContainerWith(t *testing.T, cl *criClient, name, handler, image string,
	podAnnotations map[string]string) *podContainer {
	t.Helper()
	p := c.runPod(t, cl, name, handler, podAnnotations)
	cfg := containerConfig("vm", image, nil)
	cid, err := cl.createContainer(p, cfg)
	if err != nil {
		t.Fatalf("CreateContainer in pod %s: %v%s", name, err, noCommandHint(err))
	}
	ctx, cancel := criCtx()
	defer cancel()
	if _, err := cl.Runtime.StartContainer(ctx, &cri.StartContainerRequest{ContainerId: cid}); err != nil {
		t.Fatalf("StartContainer %s in pod %s: %v", cid, name, err)
	}
	v := &podContainer{pod: p, cid: cid, logPath: filepath.Join(p.logDir, cfg.LogPath)}
	t.Cleanup(func() {
		if t.Failed() {
			b, err := os.ReadFile(v.logPath)
			t.Logf("CRI log %s of pod %s (tail, %v):\n%s", v.logPath, name, err, testenv.Tail(string(b), 40))
		}
	})
	return v
}

// stopContainer stops the container with kubelet's grace period and checks
// that it ended by itself on SIGTERM: exit code 0.
func (cl *criClient) stopContainer(v *podContainer) error {
	ctx, cancel := criCtx()
	defer cancel()
	start := time.Now()
	if _, err := cl.Runtime.StopContainer(ctx, &cri.StopContainerRequest{ContainerId: v.cid, Timeout: criStopGrace}); err != nil {
		return fmt.Errorf("StopContainer %s: %w", v.cid, err)
	}
	took := time.Since(start)
	resp, err := cl.Runtime.ContainerStatus(ctx, &cri.ContainerStatusRequest{ContainerId: v.cid})
	if err != nil {
		return fmt.Errorf("ContainerStatus %s: %w", v.cid, err)
	}
	st := resp.Status
	if st.State != cri.ContainerState_CONTAINER_EXITED || st.ExitCode != 0 {
		return fmt.Errorf("after StopContainer (%v): state %s exit code %d reason %q, want EXITED with 0",
			took, st.State, st.ExitCode, st.Reason)
	}
	return nil
}

// removePod removes the container, then stops and removes the sandbox.
func (cl *criClient) removePod(t *testing.T, v *podContainer) {
	t.Helper()
	ctx, cancel := criCtx()
	defer cancel()
	if _, err := cl.Runtime.RemoveContainer(ctx, &cri.RemoveContainerRequest{ContainerId: v.cid}); err != nil {
		t.Errorf("RemoveContainer %s: %v", v.cid, err)
	}
	cl.stopAndRemovePod(t, v.pod)
}

func (v *podContainer) shimIDs() []shimID {
	return []shimID{{nsCRI, v.id}, {nsCRI, v.cid}}
}

// waitStats polls ContainerStats until it reports cpu usage and memory
// working set above zero.
func (cl *criClient) waitStats(t *testing.T, id string) *cri.ContainerStats {
	t.Helper()
	var stats *cri.ContainerStats
	if err := poll(30*time.Second, func() (bool, string) {
		ctx, cancel := criCtx()
		defer cancel()
		resp, err := cl.Runtime.ContainerStats(ctx, &cri.ContainerStatsRequest{ContainerId: id})
		if err != nil {
			return false, "ContainerStats: " + err.Error()
		}
		stats = resp.Stats
		return stats.GetCpu().GetUsageCoreNanoSeconds().GetValue() > 0 &&
				stats.GetMemory().GetWorkingSetBytes().GetValue() > 0,
			fmt.Sprintf("ContainerStats cpu %v memory %v", stats.GetCpu(), stats.GetMemory())
	}); err != nil {
		t.Fatalf("want cpu usage and memory working set > 0: %v", err)
	}
	t.Logf("stats: cpu %d ns, memory working set %d bytes",
		stats.Cpu.UsageCoreNanoSeconds.Value, stats.Memory.WorkingSetBytes.Value)
	return stats
}

// noCommandHint explains CRI's "no command specified": kubelet passes the
// pod spec's command, and CRI refuses a container when neither it nor the
// image config (Entrypoint/Cmd) names one, even though a VM needs none.
func noCommandHint(err error) string {
	if err == nil || !strings.Contains(err.Error(), "no command specified") {
		return ""
	}
	return "\n(the image config has no Entrypoint or Cmd; CRI requires one: the VM images need a nominal Cmd)"
}
