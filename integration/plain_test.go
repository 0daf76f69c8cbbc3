//go:build integration

package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/testenv"
)

// plainContainer is a container of the busybox image running argv: no VM
// image in it, so the shim hands it to runc (plain_containers on).
func plainContainer(name, image string, argv ...string) *cri.ContainerConfig {
	return &cri.ContainerConfig{
		Metadata: &cri.ContainerMetadata{Name: name},
		Image:    &cri.ImageSpec{Image: image},
		Command:  argv,
		LogPath:  name + "/0.log",
	}
}

// runContainer creates and starts cfg in p.
func (cl *criClient) runContainer(t *testing.T, p *pod, cfg *cri.ContainerConfig) string {
	t.Helper()
	cid, err := cl.createContainer(p, cfg)
	if err != nil {
		t.Fatalf("CreateContainer %s: %v", cfg.Metadata.Name, err)
	}
	ctx, cancel := criCtx()
	defer cancel()
	if _, err := cl.Runtime.StartContainer(ctx, &cri.StartContainerRequest{ContainerId: cid}); err != nil {
		t.Fatalf("StartContainer %s: %v", cfg.Metadata.Name, err)
	}
	return cid
}

// nsLinks reads the namespace links of pid named in kinds.
func nsLinks(t *testing.T, pid int, kinds ...string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, k := range kinds {
		l, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/%s", pid, k))
		if err != nil {
			t.Fatalf("namespace %s of pid %d: %v", k, pid, err)
		}
		out[k] = l
	}
	return out
}

// criTaskPid is the pid containerd reports for a task of the CRI namespace.
func (c *containerd) criTaskPid(t *testing.T, id string) int {
	t.Helper()
	_, pid, err := c.taskStatus(nsCRI, id)
	if err != nil || pid <= 0 {
		t.Fatalf("pid of task %s: %d, %v", id, pid, err)
	}
	return pid
}

// TestCRIPlainContainers runs a mixed pod through the kvm shim with
// plain_containers on (handler kvm-plain), as kubelet would: two plain
// init containers (exit 0 and exit 3) run to completion with runc, then
// the VM boots, and a plain sidecar runs beside it and answers exec. The
// sandbox is a real pause process with its own IPC and UTS namespaces,
// which the plain containers share, never the host's. Afterwards no
// runc container, domain, mount or shim is left.
func TestCRIPlainContainers(t *testing.T) {
	s := requireKVM(t, "kernel", "pause", "busybox")
	busybox := s.images["busybox"].ref
	s.forEachFlavour(t, func(t *testing.T, c *containerd) {
		c.cleanupAfter(t)
		cl := c.cri(t)
		p := c.runPod(t, cl, "mixed", testenv.HandlerKVMPlain, nil)
		ids := []shimID{{nsCRI, p.id}}

		pausePid := c.criTaskPid(t, p.id)
		// runc start returns once runc init is told to go on, which may be
		// a moment before it has exec'd the image's program.
		if err := poll(5*time.Second, func() (bool, string) {
			cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pausePid))
			return strings.HasPrefix(string(cmd), "/pause"), fmt.Sprintf("runs %q", cmd)
		}); err != nil {
			t.Fatalf("sandbox task pid %d, want the image's /pause: %v", pausePid, err)
		}
		host := nsLinks(t, os.Getpid(), "ipc", "uts", "net", "mnt") // the test runs in the host's
		pause := nsLinks(t, pausePid, "ipc", "uts", "net")
		for _, k := range []string{"ipc", "uts", "net"} {
			if pause[k] == host[k] {
				t.Errorf("the pause shares the host's %s namespace (%s)", k, host[k])
			}
		}

		inits := map[string]int32{"init-ok": 0, "init-fails": 3}
		for _, name := range []string{"init-ok", "init-fails"} {
			cfg := plainContainer(name, busybox, "/bin/busybox", "sh", "-c",
				fmt.Sprintf("echo %s ran as $(/bin/busybox id -u) on $(/bin/busybox hostname); exit %d", name, inits[name]))
			cid := cl.runContainer(t, p, cfg)
			ids = append(ids, shimID{nsCRI, cid})
			st := cl.waitContainerState(t, cid, cri.ContainerState_CONTAINER_EXITED, time.Minute)
			if st.ExitCode != inits[name] {
				t.Errorf("%s exited with %d, want %d", name, st.ExitCode, inits[name])
			}
			if err := waitLog(filepath.Join(p.logDir, cfg.LogPath), name+" ran as 0 on mixed", 10*time.Second); err != nil {
				t.Errorf("%s: %v", name, err)
			}
			c.removeContainer(t, cl, cid)
		}

		vcfg := containerConfig("vm", s.images["kernel"].ref, nil)
		vid := cl.runContainer(t, p, vcfg)
		ids = append(ids, shimID{nsCRI, vid})
		if err := waitLog(filepath.Join(p.logDir, vcfg.LogPath), readyLine, bootTimeout); err != nil {
			t.Fatal(err)
		}

		sid := cl.runContainer(t, p, plainContainer("sidecar", busybox, "/bin/busybox", "sleep", "3600"))
		ids = append(ids, shimID{nsCRI, sid})
		cl.waitContainerState(t, sid, cri.ContainerState_CONTAINER_RUNNING, time.Minute)
		side := nsLinks(t, c.criTaskPid(t, sid), "ipc", "uts", "net", "mnt")
		for _, k := range []string{"ipc", "uts", "net"} {
			if side[k] != pause[k] {
				t.Errorf("the sidecar's %s namespace is %s, want the pause's %s (host's: %s)", k, side[k], pause[k], host[k])
			}
		}
		if side["mnt"] == host["mnt"] {
			t.Errorf("the sidecar runs in the host's mount namespace")
		}
		r, err := cl.execSync(sid, 30, "/bin/busybox", "sh", "-c", "/bin/busybox hostname; echo to-stderr >&2; exit 7")
		if err != nil || r.ExitCode != 7 || strings.TrimSpace(string(r.Stdout)) != "mixed" || strings.TrimSpace(string(r.Stderr)) != "to-stderr" {
			t.Errorf("ExecSync in the sidecar: %v %v; want exit 7, stdout the pod's hostname, stderr to-stderr", r, err)
		}
		cl.waitStats(t, sid)

		// StopContainer's SIGTERM ends busybox sleep: 128+15, as runc
		// pods report it (measured on both containerds).
		ctx, cancel := criCtx()
		_, err = cl.Runtime.StopContainer(ctx, &cri.StopContainerRequest{ContainerId: sid, Timeout: 2})
		cancel()
		if err != nil {
			t.Fatalf("StopContainer sidecar: %v", err)
		}
		if st := cl.containerStatus(t, sid); st.State != cri.ContainerState_CONTAINER_EXITED || st.ExitCode != 143 {
			t.Errorf("sidecar after StopContainer: %s exit %d, want EXITED 143", st.State, st.ExitCode)
		}
		if st := cl.containerStatus(t, vid); st.State != cri.ContainerState_CONTAINER_RUNNING {
			t.Errorf("the VM is %s after its sidecar stopped, want RUNNING", st.State)
		}
		if err := cl.stopContainer(&podContainer{pod: p, cid: vid}); err != nil {
			t.Error(err)
		}
		for _, cid := range []string{sid, vid} {
			c.removeContainer(t, cl, cid)
		}
		cl.stopAndRemovePod(t, p)
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pausePid)); err == nil {
			t.Errorf("the pause (pid %d) still runs after RemovePodSandbox", pausePid)
		}
		assertNothingLeft(t, c, ids...)
	})
}

// removeContainer removes a container through CRI.
func (c *containerd) removeContainer(t *testing.T, cl *criClient, cid string) {
	t.Helper()
	ctx, cancel := criCtx()
	defer cancel()
	if _, err := cl.Runtime.RemoveContainer(ctx, &cri.RemoveContainerRequest{ContainerId: cid}); err != nil {
		t.Errorf("RemoveContainer %s: %v", cid, err)
	}
}

// TestCRIPlainContainerRefused: with plain_containers off (handler kvm)
// a plain image is refused at CreateContainer with a message naming the
// switch, and nothing is left.
func TestCRIPlainContainerRefused(t *testing.T) {
	s := requireKVM(t, "pause", "busybox")
	s.forEachFlavour(t, func(t *testing.T, c *containerd) {
		c.cleanupAfter(t)
		cl := c.cri(t)
		p := c.runPod(t, cl, "plain-off", "kvm", nil)
		// CRI makes the task (the shim's Create) at StartContainer.
		cid, err := cl.createContainer(p, plainContainer("sidecar", s.images["busybox"].ref, "/bin/busybox", "true"))
		if err != nil {
			t.Fatalf("CreateContainer: %v", err)
		}
		ctx, cancel := criCtx()
		_, err = cl.Runtime.StartContainer(ctx, &cri.StartContainerRequest{ContainerId: cid})
		cancel()
		if err == nil || !strings.Contains(err.Error(), "plain_containers") || !strings.Contains(err.Error(), "/disk/") {
			t.Errorf("StartContainer of a plain image with plain_containers off: %v; want a refusal naming plain_containers", err)
		}
		c.removeContainer(t, cl, cid)
		cl.stopAndRemovePod(t, p)
		assertNothingLeft(t, c, shimID{nsCRI, p.id}, shimID{nsCRI, cid})
	})
}

// TestCRIPauseSandboxCost runs pods of handler kvm (the shim as the
// sandbox), kvm-plain (a runc pause: plain_containers on) and runc
// (containerd's own runc shim) alternating in one containerd, checks that
// each starts and leaves nothing, and logs what RunPodSandbox took with
// each (median): the figures of docs/performance.md, "The real pause".
// It judges no time: this host's cores are shared, single RunPodSandbox
// calls vary by a factor of two, and performance goals are judged by
// figures, not by a timed test.
func TestCRIPauseSandboxCost(t *testing.T) {
	s := requireKVM(t, "pause")
	s.forEachFlavour(t, func(t *testing.T, c *containerd) {
		c.cleanupAfter(t)
		cl := c.cri(t)
		const rounds = 5
		handlers := []string{"kvm", testenv.HandlerKVMPlain, "runc"}
		took := map[string][]time.Duration{}
		var ids []shimID
		for i := range rounds {
			for _, h := range handlers {
				start := time.Now()
				p := c.runPod(t, cl, fmt.Sprintf("cost-%d", i), h, nil)
				took[h] = append(took[h], time.Since(start))
				ids = append(ids, shimID{nsCRI, p.id})
				cl.stopAndRemovePod(t, p)
			}
		}
		median := func(d []time.Duration) time.Duration {
			d = slices.Clone(d)
			slices.Sort(d)
			return d[len(d)/2]
		}
		shim, pause, runc := median(took["kvm"]), median(took[testenv.HandlerKVMPlain]), median(took["runc"])
		t.Logf("RunPodSandbox median of %d: kvm (shim as sandbox) %v, kvm-plain (runc pause) %v (+%v), runc handler %v",
			rounds, shim, pause, pause-shim, runc)
		t.Logf("every RunPodSandbox: kvm %v, kvm-plain %v, runc %v", took["kvm"], took[testenv.HandlerKVMPlain], took["runc"])
		assertNothingLeft(t, c, ids...)
	})
}
