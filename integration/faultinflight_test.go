//go:build integration

package integration

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/faultpoint"
	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/testenv"
)

// TestFaultInFlight: the rows of the fault table (docs/faults.md) where a
// component dies while the shim is in the middle of a call. Through CRI,
// StartContainer makes the task (the shim's Create) and starts it (the
// shim's Start), and the task is deleted (the shim's Delete) as soon as
// CRI sees the VM exit. The fault-injection build of the shim holds it at
// one step of each (hold files, internal/faultpoint), so each kill
// hits the call in flight, never by luck of timing; a cell whose call ends
// before the shim is held fails.
//
//   - creating: held once the domain is defined (mounts, TAP, NUMA, config
//     drive made), StartContainer in flight;
//   - starting: held once libvirt created the domain (QEMU runs, vCPUs
//     paused, no console yet), StartContainer in flight;
//   - deleting: held after the guest powered off (StopContainer), in the
//     task's Delete before the domain is undefined.
//
// Each cell asserts its outcome (cells below) and ends with the leftover
// check.
func TestFaultInFlight(t *testing.T) {
	s := requireKVM(t, "kernel", "pause")
	image := s.images["kernel"].ref
	s.useFaultShim(t)
	s.forEachFlavourAtOnce(t, func(t *testing.T, c *containerd) {
		for _, cell := range inFlightCells(c) {
			t.Run(cell.phase+"/"+cell.component, func(t *testing.T) {
				s.holdHost(t, cell.component)
				c.cleanupAfter(t)
				start := time.Now()
				if cell.phase == "deleting" {
					deletingCell(t, c, image, cell)
				} else {
					startingCell(t, c, image, cell)
				}
				t.Logf("cell took %v", time.Since(start).Round(time.Second))
			})
		}
	})
}

// inFlightCell is one cell: the phase, the step the shim is held at, and
// the component killed there. kill lets the held shim (pid held) go on by
// h.release at the point that makes the cell: a daemon once it is back,
// the shim once it is dead, containerd while it is down (the shim ends the
// call with nobody to answer, as when containerd takes its time to restart).
type inFlightCell struct {
	phase     string
	step      faultpoint.Point
	component string
	kill      func(t *testing.T, h *hold, held int, v *podContainer)
}

// inFlightCells lists the cells: in each phase the shim (the held process
// itself), containerd, libvirtd and virtlogd; QEMU in the starting phase
// only (while creating it does not exist yet, while deleting it is gone).
func inFlightCells(c *containerd) []inFlightCell {
	killers := []inFlightCell{
		{component: "shim", kill: killHeldShim},
		{component: "containerd", kill: func(t *testing.T, h *hold, _ int, _ *podContainer) {
			if err := c.Crash(); err != nil {
				t.Fatal(err)
			}
			h.release()
			h.waitGone(t)
			if err := c.Relaunch(context.Background()); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, d := range daemonFaults(c)[1:] { // libvirtd, virtlogd
		kill := d.kill
		killers = append(killers, inFlightCell{component: d.component, kill: func(t *testing.T, h *hold, _ int, v *podContainer) {
			kill(t, v)
			h.release()
		}})
	}
	qemu := inFlightCell{component: "qemu", kill: killQEMUHeld(c)}
	steps := []struct {
		phase string
		step  faultpoint.Point
	}{
		{"creating", faultpoint.Defined},
		{"starting", faultpoint.LibvirtCreated},
		{"deleting", faultpoint.ReleaseUndefine},
	}
	var cells []inFlightCell
	for _, st := range steps {
		ks := killers
		if st.phase == "starting" {
			ks = append(ks[:len(ks):len(ks)], qemu)
		}
		for _, k := range ks {
			cells = append(cells, inFlightCell{phase: st.phase, step: st.step, component: k.component, kill: k.kill})
		}
	}
	return cells
}

// killHeldShim is the shim's cell: the held shim itself is killed with
// SIGKILL, and the hold released once it is dead (the cleanup `delete`
// containerd runs is the same build, and must not wait at the step).
func killHeldShim(t *testing.T, h *hold, held int, _ *podContainer) {
	t.Helper()
	if err := syscall.Kill(held, syscall.SIGKILL); err != nil {
		t.Fatalf("kill the held shim %d: %v", held, err)
	}
	if err := poll(stopTimeout, func() (bool, string) {
		return syscall.Kill(held, 0) != nil, fmt.Sprintf("shim %d still alive", held)
	}); err != nil {
		t.Fatal(err)
	}
	h.release()
	_ = os.Remove(h.held)
}

// killQEMUHeld is QEMU's cell: the VM's QEMU killed while the shim is
// held, then the shim let go.
func killQEMUHeld(c *containerd) func(t *testing.T, h *hold, held int, v *podContainer) {
	return func(t *testing.T, h *hold, _ int, v *podContainer) {
		killQEMU(t, c, v)
		h.release()
	}
}

// killQEMU kills the QEMU of the pod's VM with SIGKILL.
func killQEMU(t *testing.T, c *containerd, v *podContainer) {
	t.Helper()
	dom := c.podDomain(t, v)
	procs := domainProcesses(dom)
	if len(procs) == 0 {
		t.Fatalf("no QEMU process of %s", dom)
	}
	for _, p := range procs {
		_ = syscall.Kill(p.Pid, syscall.SIGKILL)
	}
}

// startingCell: StartContainer is in flight, the shim held in its Create
// or Start, when the component dies.
//
//   - the shim: StartContainer fails (the container EXITED with 128,
//     StartError); kubelet's recovery of the dead sandbox boots the VM in
//     a new sandbox of the pod (recoverDeadSandbox), and the removal leaves
//     nothing;
//   - QEMU: StartContainer fails; the container is not running, exit status
//     not 0; the removal leaves nothing;
//   - libvirtd, virtlogd: StartContainer succeeds once the shim goes on
//     (it reconnects to libvirtd), the guest boots, a stop ends with 0;
//   - containerd: the call dies with it, and the shim ends it while
//     containerd is down. A Create undoes its task (nobody could ever
//     delete it): once containerd is back the container is CREATED and a
//     new attempt of it (kubelet's retry) boots the VM in the same pod
//     (stop → 0). A Start completes: once containerd is back the container
//     is RUNNING (CRI adopts the running task) and a stop ends with 0.
func startingCell(t *testing.T, c *containerd, image string, cell inFlightCell) {
	cl := c.cri(t)
	p := c.runPod(t, cl, "vm-"+cell.phase+"-"+cell.component, "kvm", nil)
	cid, err := cl.createContainer(p, containerConfig("vm", image, nil))
	if err != nil {
		t.Fatal(err)
	}
	v := &podContainer{pod: p, cid: cid}
	h := holdShim(t, c, cell.step)
	done := make(chan error, 1)
	go func() {
		ctx, cancel := criCtx()
		defer cancel()
		_, startContainerErr := cl.Runtime.StartContainer(ctx, &cri.StartContainerRequest{ContainerId: cid})
		done <- startContainerErr
	}()
	held := h.waitHeld(t, done)
	cell.kill(t, h, held, v)
	err = <-done
	t.Logf("StartContainer with the shim held at %s across %s's kill returned %v", cell.step, cell.component, err)
	cl = c.cri(t)
	switch cell.component {
	case "shim", "qemu":
		if err == nil {
			t.Errorf("StartContainer succeeded though %s was killed in it", cell.component)
		}
		st := cl.containerStatus(t, cid)
		t.Logf("the container is %s with %d (%s)", st.State, st.ExitCode, st.Reason)
		if st.State == cri.ContainerState_CONTAINER_RUNNING {
			t.Errorf("the container is RUNNING after %s's kill in its start", cell.component)
		}
		if st.State == cri.ContainerState_CONTAINER_EXITED && st.ExitCode == 0 {
			t.Errorf("the container exited with 0 after %s's kill in its start", cell.component)
		}
		if cell.component == "shim" {
			ids := recoverDeadSandbox(t, c, cl, v, image)
			assertNothingLeft(t, c, ids...)
			return
		}
		cl.stopAndRemovePod(t, p)
	case "containerd":
		st := cl.containerStatus(t, cid)
		t.Logf("after containerd came back the container is %s with %d (%s)", st.State, st.ExitCode, st.Reason)
		if cell.phase == "creating" {
			if st.State != cri.ContainerState_CONTAINER_CREATED {
				t.Errorf("the container is %s, want CREATED (its task undone by the shim)", st.State)
			}
			retryContainer(t, cl, p, image)
		} else {
			if st.State != cri.ContainerState_CONTAINER_RUNNING {
				t.Fatalf("the container is %s, want RUNNING (the shim finished the start)", st.State)
			}
			cl.waitAgentCRI(t, cid, bootTimeout)
			if stopContainerErr := cl.stopContainer(v); stopContainerErr != nil {
				t.Error(stopContainerErr)
			}
		}
		cl.stopAndRemovePod(t, p)
	default:
		if err != nil {
			t.Fatalf("StartContainer across %s's kill: %v", cell.component, err)
		}
		cl.waitAgentCRI(t, cid, bootTimeout)
		if err := cl.stopContainer(v); err != nil {
			t.Error(err)
		}
		cl.removePod(t, v)
	}
	assertNothingLeft(t, c, v.shimIDs()...)
}

// retryContainer is kubelet's retry of a container that did not start: a
// new attempt in the same pod, started; the guest boots and a stop ends
// with 0.
func retryContainer(t *testing.T, cl *criClient, p *pod, image string) {
	t.Helper()
	cfg := containerConfig("vm", image, nil)
	cfg.Metadata.Attempt = 1
	cfg.LogPath = "vm/1.log"
	cid, err := cl.createContainer(p, cfg)
	if err != nil {
		t.Fatalf("CreateContainer, attempt 1: %v", err)
	}
	ctx, cancel := criCtx()
	defer cancel()
	if _, err := cl.Runtime.StartContainer(ctx, &cri.StartContainerRequest{ContainerId: cid}); err != nil {
		t.Fatalf("StartContainer, attempt 1: %v", err)
	}
	cl.waitAgentCRI(t, cid, bootTimeout)
	if err := cl.stopContainer(&podContainer{pod: p, cid: cid}); err != nil {
		t.Error(err)
	}
}

// deletingCell: the guest powered off after StopContainer's SIGTERM, and
// the task's Delete (CRI deletes the task as it sees the exit) is held
// before the domain is undefined when the component dies. The guest's own
// power-off is what the container reports, EXITED with 0, except when
// containerd died: it is back to find the task deleted (the shim finished
// the Delete meanwhile) before CRI recorded the exit, and CRI reports its
// unknown exit, 255 "Unknown" (seen on 1.6 and 2.x). StopContainer is
// retried where the kill cut it, as kubelet does, and the
// removal leaves nothing (a dead shim's leftovers are undone by
// containerd's cleanup `delete`, the rest by the Delete going on; a dead
// shim's pod is recovered by kubelet first, recoverDeadSandbox).
func deletingCell(t *testing.T, c *containerd, image string, cell inFlightCell) {
	cl := c.cri(t)
	v := c.startPodVM(t, cl, "vm-"+cell.phase+"-"+cell.component, image)
	h := holdShim(t, c, cell.step)
	done := stopInBackground(cl, v.cid)
	held := h.waitHeld(t, done)
	cell.kill(t, h, held, v)
	err := <-done
	t.Logf("StopContainer with the task's Delete held at %s across %s's kill returned %v", cell.step, cell.component, err)
	cl = c.cri(t)
	if err != nil {
		ctx, cancel := criCtx()
		_, err := cl.Runtime.StopContainer(ctx, &cri.StopContainerRequest{ContainerId: v.cid, Timeout: criStopGrace})
		cancel()
		if err != nil {
			t.Errorf("StopContainer again (as kubelet retries): %v", err)
		}
	}
	st := cl.waitContainerState(t, v.cid, cri.ContainerState_CONTAINER_EXITED, stopTimeout)
	if want := deletingExit(cell.component); st.ExitCode != want {
		t.Errorf("the guest powered off, then %s died in the task's Delete: exit code %d reason %q, want %d", cell.component, st.ExitCode,
			st.Reason, want)
	}
	if cell.component == "shim" {
		assertNothingLeft(t, c, recoverDeadSandbox(t, c, cl, v, image)...)
		return
	}
	cl.removePod(t, v)
	assertNothingLeft(t, c, v.shimIDs()...)
}

// recoverDeadSandbox is kubelet's recovery of a pod whose shim died (as
// in TestCRIShimKilled): the dead sandbox stopped, a new sandbox of the
// same pod uid with the container again (its guest boots, a stop ends
// with 0), then the dead container and sandbox removed and the pod at the
// end. The pod's data is removed with its last sandbox: a pod deleted
// instead, whose shim is dead, keeps its disk (docs/limitations.md).
// It returns the ids for the leftover check.
func recoverDeadSandbox(t *testing.T, c *containerd, cl *criClient, v *podContainer, image string) []shimID {
	t.Helper()
	ctx, cancel := criCtx()
	defer cancel()
	if _, err := cl.Runtime.StopPodSandbox(ctx, &cri.StopPodSandboxRequest{PodSandboxId: v.pod.id}); err != nil {
		t.Errorf("StopPodSandbox %s (dead shim): %v", v.pod.id, err)
	}
	again := c.restartPod(t, cl, v, image)
	cl.waitAgentCRI(t, again.cid, bootTimeout)
	if err := cl.stopContainer(again); err != nil {
		t.Error(err)
	}
	cl.removePod(t, v)
	cl.removePod(t, again)
	return append(v.shimIDs(), again.shimIDs()...)
}

// hold makes the fault-injection shim of one containerd wait at a point
// (internal/faultpoint) while its hold file exists.
type hold struct {
	step       faultpoint.Point
	hold, held string
}

// holdShim holds c's shims at step until release; the files go at the end
// of t whatever happened.
func holdShim(t *testing.T, c *containerd, step faultpoint.Point) *hold {
	t.Helper()
	h := &hold{step: step, hold: faultpoint.HoldFile(c.ShimStateDir, step), held: faultpoint.HeldFile(c.ShimStateDir, step)}
	if err := os.WriteFile(h.hold, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		h.release()
		// A shim killed while held could not remove its mark.
		_ = os.Remove(h.held)
	})
	return h
}

// waitGone waits until the held shim went on (its mark is gone).
func (h *hold) waitGone(t *testing.T) {
	t.Helper()
	if err := poll(stopTimeout, func() (bool, string) {
		_, err := os.Lstat(h.held)
		return errors.Is(err, os.ErrNotExist), h.held + " is still there"
	}); err != nil {
		t.Fatal(err)
	}
}

// release lets the held shim go on.
func (h *hold) release() {
	if err := os.Remove(h.hold); err != nil && !errors.Is(err, os.ErrNotExist) {
		panic(err)
	}
}

// waitHeld waits until a shim is held at the step and returns its pid. It
// fails t when the call in flight (done) ends first: the cell would not
// test what it says.
func (h *hold) waitHeld(t *testing.T, done <-chan error) int {
	t.Helper()
	deadline := time.After(bootTimeout)
	for {
		if b, err := os.ReadFile(h.held); err == nil {
			if pid, err := strconv.Atoi(string(b)); err == nil && pid > 0 {
				return pid
			}
		}
		select {
		case err := <-done:
			t.Fatalf("the call ended (%v) before the shim was held at %s: the cell missed the call in flight", err, h.step)
		case <-deadline:
			t.Fatalf("no shim was held at %s within %v", h.step, bootTimeout)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// faultShim is the shim built with the faultinject tag, built once per run,
// and the shim the suite built (kept by a link while the other is in place).
var faultShim struct {
	once       sync.Once
	path, prod string
	err        error

	mu    sync.Mutex
	users int // tests that want it in place now; guarded by mu
}

// useFaultShim puts the fault-injection build of the shim where the
// suite's containerds find theirs for the rest of t, and the suite's own
// back after the last test that wanted it (the flavours of a test run at
// once, forEachFlavourAtOnce: one flavour's cell must not put the suite's
// shim back under the other's). A shim already running keeps its binary;
// without a hold file the fault-injection build behaves as the suite's.
func (s *testSuite) useFaultShim(t *testing.T) {
	t.Helper()
	if s.shimErr != nil {
		t.Fatal(s.shimErr)
	}
	installed := filepath.Join(s.binDir, shimBinary)
	faultShim.once.Do(func() {
		faultShim.path = filepath.Join(s.tmp, "bin-faultinject", shimBinary)
		faultShim.prod = filepath.Join(s.tmp, "bin-suite", shimBinary)
		if faultShim.err = testenv.BuildFaultShim(s.repo, faultShim.path); faultShim.err != nil {
			return
		}
		if faultShim.err = os.MkdirAll(filepath.Dir(faultShim.prod), 0o755); faultShim.err != nil {
			return
		}
		faultShim.err = os.Link(installed, faultShim.prod)
	})
	if faultShim.err != nil {
		t.Fatalf("the fault-injection shim: %v", faultShim.err)
	}
	faultShim.mu.Lock()
	defer faultShim.mu.Unlock()
	if faultShim.users == 0 {
		installShim(t, faultShim.path, installed)
	}
	faultShim.users++
	t.Cleanup(func() {
		faultShim.mu.Lock()
		defer faultShim.mu.Unlock()
		if faultShim.users--; faultShim.users == 0 {
			installShim(t, faultShim.prod, installed)
		}
	})
}

// installShim replaces the binary at dst by src, atomically: a shim
// containerd starts meanwhile runs one or the other, never half a file.
func installShim(t *testing.T, src, dst string) {
	t.Helper()
	tmp := dst + ".new"
	_ = os.Remove(tmp)
	if err := os.Link(src, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		t.Fatal(fmt.Errorf("install %s as %s: %w", src, dst, err))
	}
}

// deletingExit is the exit status CRI reports after the component died in
// the task's Delete (deletingCell).
func deletingExit(component string) int32 {
	if component == "containerd" {
		return 255
	}
	return 0
}
