package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// CRI is a CRI client of one daemon, making the calls kubelet makes.
type CRI struct {
	Runtime cri.RuntimeServiceClient
	Images  cri.ImageServiceClient

	conn   *grpc.ClientConn
	logDir string // pods' log directories go below
}

// DialCRI connects to the daemon's CRI service.
func (c *Containerd) DialCRI() (*CRI, error) {
	conn, err := grpc.Dial("unix://"+c.Address, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("dial CRI at %s: %w", c.Address, err)
	}
	return &CRI{
		Runtime: cri.NewRuntimeServiceClient(conn),
		Images:  cri.NewImageServiceClient(conn),
		conn:    conn,
		logDir:  filepath.Join(c.Dir, "pod-logs"),
	}, nil
}

// Close closes the connection.
func (cl *CRI) Close() error { return cl.conn.Close() }

// WaitReady polls until CRI answers Version, and Status with the runtime
// and the network (the CNI config is loaded) ready.
func (cl *CRI) WaitReady(ctx context.Context) error {
	return Poll(ctx, 100*time.Millisecond, func() (bool, string) {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if _, err := cl.Runtime.Version(cctx, &cri.VersionRequest{}); err != nil {
			return false, "CRI Version: " + err.Error()
		}
		st, err := cl.Runtime.Status(cctx, &cri.StatusRequest{})
		if err != nil {
			return false, "CRI Status: " + err.Error()
		}
		ready := map[string]bool{}
		var detail []string
		for _, cond := range st.GetStatus().GetConditions() {
			ready[cond.Type] = cond.Status
			detail = append(detail, fmt.Sprintf("%s=%v %s %s", cond.Type, cond.Status, cond.Reason, cond.Message))
		}
		return ready[cri.RuntimeReady] && ready[cri.NetworkReady], "CRI conditions: " + strings.Join(detail, "; ")
	})
}

// Pod is a pod sandbox made through CRI.
type Pod struct {
	ID     string
	Config *cri.PodSandboxConfig
}

// PodOptions describe a pod sandbox.
type PodOptions struct {
	Name, Namespace, UID string // Namespace "" means "testenv"; UID "" means Namespace/Name
	Handler              string // runtime handler: "kvm" or "runc"
	Annotations          map[string]string
	CgroupParent         string // the pod's cgroup, as kubelet's cgroupfs driver names it; "" for none
	// HostNetwork runs the pod in the node's network namespace
	// (hostNetwork: true): no netns, no CNI.
	HostNetwork bool
}

// RunPod runs a pod sandbox. Its log directory is below the daemon's Dir.
func (cl *CRI) RunPod(ctx context.Context, o PodOptions) (*Pod, error) {
	if o.Namespace == "" {
		o.Namespace = "testenv"
	}
	if o.UID == "" {
		o.UID = o.Namespace + "-" + o.Name
	}
	logDir := filepath.Join(cl.logDir, o.Namespace, o.Name)
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		return nil, err
	}
	cfg := &cri.PodSandboxConfig{
		Metadata:     &cri.PodSandboxMetadata{Name: o.Name, Namespace: o.Namespace, Uid: o.UID},
		Hostname:     o.Name,
		LogDirectory: logDir,
		Labels:       map[string]string{"app": o.Name},
		Annotations:  o.Annotations,
		Linux:        &cri.LinuxPodSandboxConfig{CgroupParent: o.CgroupParent},
	}
	if o.HostNetwork {
		cfg.Linux.SecurityContext = &cri.LinuxSandboxSecurityContext{
			NamespaceOptions: &cri.NamespaceOption{Network: cri.NamespaceMode_NODE},
		}
	}
	resp, err := cl.Runtime.RunPodSandbox(ctx, &cri.RunPodSandboxRequest{Config: cfg, RuntimeHandler: o.Handler})
	if err != nil {
		return nil, fmt.Errorf("RunPodSandbox %s (handler %s): %w", o.Name, o.Handler, err)
	}
	return &Pod{ID: resp.PodSandboxId, Config: cfg}, nil
}

// ContainerOptions describe a container in a pod.
type ContainerOptions struct {
	Name        string
	Image       string
	Annotations map[string]string
	// MemoryLimit in bytes; 0 sets none (the kvm shim then uses its
	// default_memory_mib).
	MemoryLimit int64
	// CPUs sets a CPU limit (quota over a 100 ms period); 0 sets none.
	CPUs int64
	// Devices and Mounts are the container's volumes as kubelet passes
	// them: raw block volumes and filesystem volumes.
	Devices []*cri.Device
	Mounts  []*cri.Mount
}

// LogPath is where CRI writes the container's log (for a VM: its console).
func (p *Pod) LogPath(container string) string {
	return filepath.Join(p.Config.LogDirectory, container, "0.log")
}

// CreateContainer creates a container in pod p; like kubelet, it makes the
// container's log directory first.
func (cl *CRI) CreateContainer(ctx context.Context, p *Pod, o ContainerOptions) (string, error) {
	logPath := p.LogPath(o.Name)
	if err := os.MkdirAll(filepath.Dir(logPath), 0o755); err != nil {
		return "", err
	}
	cfg := &cri.ContainerConfig{
		Metadata:    &cri.ContainerMetadata{Name: o.Name},
		Image:       &cri.ImageSpec{Image: o.Image},
		LogPath:     filepath.Join(o.Name, "0.log"),
		Annotations: o.Annotations,
		Linux:       &cri.LinuxContainerConfig{Resources: &cri.LinuxContainerResources{MemoryLimitInBytes: o.MemoryLimit}},
		Devices:     o.Devices,
		Mounts:      o.Mounts,
	}
	if o.CPUs > 0 {
		cfg.Linux.Resources.CpuPeriod, cfg.Linux.Resources.CpuQuota = 100000, o.CPUs*100000
	}
	resp, err := cl.Runtime.CreateContainer(ctx, &cri.CreateContainerRequest{PodSandboxId: p.ID, Config: cfg, SandboxConfig: p.Config})
	if err != nil {
		return "", fmt.Errorf("CreateContainer %s in pod %s: %w", o.Name, p.Config.Metadata.Name, err)
	}
	return resp.ContainerId, nil
}

// StartContainer starts a created container.
func (cl *CRI) StartContainer(ctx context.Context, id string) error {
	if _, err := cl.Runtime.StartContainer(ctx, &cri.StartContainerRequest{ContainerId: id}); err != nil {
		return fmt.Errorf("StartContainer %s: %w", id, err)
	}
	return nil
}

// ContainerState returns the container's state.
func (cl *CRI) ContainerState(ctx context.Context, id string) (*cri.ContainerStatus, error) {
	resp, err := cl.Runtime.ContainerStatus(ctx, &cri.ContainerStatusRequest{ContainerId: id})
	if err != nil {
		return nil, fmt.Errorf("ContainerStatus %s: %w", id, err)
	}
	return resp.Status, nil
}

// WaitContainerState polls ContainerStatus every interval until the
// container is in state, or ctx ends, or it exited when state is RUNNING.
func (cl *CRI) WaitContainerState(ctx context.Context, id string, state cri.ContainerState,
	interval time.Duration) (*cri.ContainerStatus, error) {
	var st *cri.ContainerStatus
	var gone error
	err := Poll(ctx, interval, func() (bool, string) {
		s, err := cl.ContainerState(ctx, id)
		if err != nil {
			return false, err.Error()
		}
		st = s
		if state == cri.ContainerState_CONTAINER_RUNNING && s.State == cri.ContainerState_CONTAINER_EXITED {
			gone = fmt.Errorf("container %s exited (code %d, %s %s) while waiting for RUNNING", id, s.ExitCode, s.Reason, s.Message)
			return true, ""
		}
		return s.State == state, fmt.Sprintf("container %s is %s, want %s", id, s.State, state)
	})
	if gone != nil {
		return st, gone
	}
	return st, err
}

// RemovePod stops and removes a pod sandbox and its containers. CRI's
// StopPodSandbox kills the containers without a grace period.
func (cl *CRI) RemovePod(ctx context.Context, id string) error {
	if _, err := cl.Runtime.StopPodSandbox(ctx, &cri.StopPodSandboxRequest{PodSandboxId: id}); err != nil {
		return fmt.Errorf("StopPodSandbox %s: %w", id, err)
	}
	if _, err := cl.Runtime.RemovePodSandbox(ctx, &cri.RemovePodSandboxRequest{PodSandboxId: id}); err != nil {
		return fmt.Errorf("RemovePodSandbox %s: %w", id, err)
	}
	return nil
}

// RemoveAllPods removes every pod sandbox CRI knows; it returns how many
// there were.
func (cl *CRI) RemoveAllPods(ctx context.Context) (int, error) {
	pods, err := cl.Runtime.ListPodSandbox(ctx, &cri.ListPodSandboxRequest{})
	if err != nil {
		return 0, fmt.Errorf("ListPodSandbox: %w", err)
	}
	var errs []error
	for _, p := range pods.Items {
		errs = append(errs, cl.RemovePod(ctx, p.Id))
	}
	return len(pods.Items), errors.Join(errs...)
}
