//go:build integration

package integration

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/faultpoint"
)

// TestFaultRunning is the "running" row of the fault table
// (docs/faults.md): a CRI pod's VM runs, one component is killed with SIGKILL
// and brought back the way the suite (containerd) or hack/setup-host.sh
// (libvirtd, virtlogd) starts it. Where the component is not QEMU the VM
// keeps running (the guest's uptime grows across the fault, no reboot),
// and a stop after it still ends with the guest's power-off: exit 0
// through CRI, so Wait and the exit event work after the daemon returned.
// QEMU killed: the container exits with 255. The shim's cell is
// TestCRIShimKilled. Nothing is left after each cell.
func TestFaultRunning(t *testing.T) {
	s := requireKVM(t, "bios", "pause")
	image := s.images["bios"].ref
	s.forEachFlavourAtOnce(t, func(t *testing.T, c *containerd) {
		cells := append(daemonFaults(c), daemonFault{"qemu", func(t *testing.T, v *podContainer) {
			dom := c.podDomain(t, v)
			procs := domainProcesses(dom)
			if len(procs) == 0 {
				t.Fatalf("no QEMU process of %s", dom)
			}
			for _, p := range procs {
				_ = syscall.Kill(p.Pid, syscall.SIGKILL)
			}
		}})
		for _, cell := range cells {
			t.Run(cell.component, func(t *testing.T) {
				s.holdHost(t, cell.component)
				c.cleanupAfter(t)
				cl := c.cri(t)
				v := c.startPodVM(t, cl, "vm-fault-"+cell.component, image)
				before, at, boot := guestUptime(t, cl, v.cid), time.Now(), guestBootID(t, cl, v.cid)
				cell.kill(t, v)
				cl = c.cri(t) // containerd may be a new process
				if cell.component == "qemu" {
					st := cl.waitContainerState(t, v.cid, cri.ContainerState_CONTAINER_EXITED, stopTimeout)
					if st.ExitCode != 255 {
						t.Errorf("QEMU killed: exit code %d, want 255", st.ExitCode)
					}
				} else {
					if st := cl.containerStatus(t, v.cid); st.State != cri.ContainerState_CONTAINER_RUNNING {
						t.Fatalf("after %s's kill the container is %s, want RUNNING", cell.component, st.State)
					}
					after := guestUptime(t, cl, v.cid)
					wall := time.Since(at).Seconds()
					t.Logf("%s killed and back: guest uptime %.1fs -> %.1fs over %.1fs of wall time", cell.component, before, after, wall)
					if again := guestBootID(t, cl, v.cid); again != boot || after < before {
						t.Errorf("the guest rebooted across %s's kill: boot id %s -> %s, uptime %.1fs -> %.1fs", cell.component, boot, again, before, after)
					}
					if err := cl.stopContainer(v); err != nil {
						t.Errorf("stop after %s came back: %v", cell.component, err)
					}
				}
				cl.removePod(t, v)
				assertNothingLeft(t, c, v.shimIDs()...)
			})
		}
	})
}

// daemonFault kills one component (and brings a daemon back).
type daemonFault struct {
	component string
	kill      func(t *testing.T, v *podContainer)
}

// daemonFaults kill containerd, libvirtd or virtlogd with SIGKILL and
// start it again as the suite or hack/setup-host.sh does.
func daemonFaults(c *containerd) []daemonFault {
	host := func(name string) func(t *testing.T, v *podContainer) {
		return func(t *testing.T, v *podContainer) {
			t.Cleanup(func() { ensureDaemon(t, name) })
			killDaemon(t, name)
			startDaemon(t, name)
		}
	}
	return []daemonFault{
		{"containerd", func(t *testing.T, v *podContainer) {
			if err := c.Crash(); err != nil {
				t.Fatal(err)
			}
			if err := c.Relaunch(context.Background()); err != nil {
				t.Fatal(err)
			}
		}},
		{"libvirtd", host("libvirtd")},
		{"virtlogd", host("virtlogd")},
	}
}

// TestFaultBetweenCalls: the create and stop rows of the fault table,
// with the kill between calls: containerd, libvirtd or virtlogd killed and
// back after CreateContainer returned, then StartContainer boots the VM
// and a stop ends with exit 0; or killed after the VM stopped, then the
// pod's removal leaves nothing. The pod's shim killed (it serves the
// sandbox, and through CRI no VM task exists before StartContainer): the
// sandbox is NOTREADY, a created container stays CREATED, a stopped one
// EXITED with 0; the pod's removal after kubelet re-created its sandbox
// leaves nothing. QEMU has no cell here: there is none before the start
// nor after the stop.
func TestFaultBetweenCalls(t *testing.T) {
	s := requireKVM(t, "bios", "pause")
	image := s.images["bios"].ref
	s.forEachFlavourAtOnce(t, func(t *testing.T, c *containerd) {
		for _, cell := range daemonFaults(c) {
			t.Run("created/"+cell.component, func(t *testing.T) {
				s.holdHost(t, cell.component)
				c.cleanupAfter(t)
				cl := c.cri(t)
				p := c.runPod(t, cl, "vm-created-"+cell.component, "kvm", nil)
				cfg := containerConfig("vm", image, nil)
				cid, err := cl.createContainer(p, cfg)
				if err != nil {
					t.Fatal(err)
				}
				v := &podContainer{pod: p, cid: cid}
				cell.kill(t, v)
				cl = c.cri(t)
				ctx, cancel := criCtx()
				_, err = cl.Runtime.StartContainer(ctx, &cri.StartContainerRequest{ContainerId: cid})
				cancel()
				if err != nil {
					t.Fatalf("StartContainer after %s's kill between create and start: %v", cell.component, err)
				}
				cl.waitAgentCRI(t, cid, bootTimeout)
				if err := cl.stopContainer(v); err != nil {
					t.Error(err)
				}
				cl.removePod(t, v)
				assertNothingLeft(t, c, v.shimIDs()...)
			})
			t.Run("stopped/"+cell.component, func(t *testing.T) {
				s.holdHost(t, cell.component)
				c.cleanupAfter(t)
				cl := c.cri(t)
				v := c.startPodVM(t, cl, "vm-stopped-"+cell.component, image)
				if err := cl.stopContainer(v); err != nil {
					t.Fatal(err)
				}
				cell.kill(t, v)
				cl = c.cri(t)
				if st := cl.containerStatus(t, v.cid); st.State != cri.ContainerState_CONTAINER_EXITED || st.ExitCode != 0 {
					t.Errorf("after %s's kill the stopped container is %s with %d, want EXITED with 0", cell.component, st.State, st.ExitCode)
				}
				cl.removePod(t, v)
				assertNothingLeft(t, c, v.shimIDs()...)
			})
		}
		t.Run("created/shim", func(t *testing.T) {
			s.holdHost(t, "shim")
			c.cleanupAfter(t)
			cl := c.cri(t)
			p := c.runPod(t, cl, "vm-created-shim", "kvm", nil)
			cid, err := cl.createContainer(p, containerConfig("vm", image, nil))
			if err != nil {
				t.Fatal(err)
			}
			killPodShim(t, c)
			cl.waitSandboxState(t, p, cri.PodSandboxState_SANDBOX_NOTREADY)
			// kubelet stops the pod whose sandbox died and makes it again;
			// the container never started.
			if st := cl.containerStatus(t, cid); st.State != cri.ContainerState_CONTAINER_CREATED {
				t.Errorf("after the shim's kill the created container is %s, want CREATED", st.State)
			}
			cl.stopAndRemovePod(t, p)
			again := resandboxAndRemove(t, cl, p)
			assertNothingLeft(t, c, shimID{nsCRI, p.id}, shimID{nsCRI, cid}, shimID{nsCRI, again.id})
		})
		t.Run("stopped/shim", func(t *testing.T) {
			s.holdHost(t, "shim")
			c.cleanupAfter(t)
			cl := c.cri(t)
			v := c.startPodVM(t, cl, "vm-stopped-shim", image)
			if err := cl.stopContainer(v); err != nil {
				t.Fatal(err)
			}
			killPodShim(t, c)
			cl.waitSandboxState(t, v.pod, cri.PodSandboxState_SANDBOX_NOTREADY)
			if st := cl.containerStatus(t, v.cid); st.State != cri.ContainerState_CONTAINER_EXITED || st.ExitCode != 0 {
				t.Errorf("after the shim's kill the stopped container is %s with %d, want EXITED with 0", st.State, st.ExitCode)
			}
			cl.removePod(t, v)
			again := resandboxAndRemove(t, cl, v.pod)
			assertNothingLeft(t, c, append(v.shimIDs(), shimID{nsCRI, again.id})...)
		})
	})
}

// resandboxAndRemove is kubelet re-creating a pod's dead sandbox (same
// uid, next attempt) and the pod then deleted: the removal of its last
// live sandbox removes the pod's data, which a dead shim's cleanup
// `delete` keeps (docs/limitations.md).
func resandboxAndRemove(t *testing.T, cl *criClient, p *pod) *pod {
	t.Helper()
	cfg := *p.config
	md := *cfg.Metadata
	md.Attempt++
	cfg.Metadata = &md
	ctx, cancel := criCtx()
	defer cancel()
	resp, err := cl.Runtime.RunPodSandbox(ctx, &cri.RunPodSandboxRequest{Config: &cfg, RuntimeHandler: "kvm"})
	if err != nil {
		t.Fatalf("RunPodSandbox %s, attempt %d: %v", md.Name, md.Attempt, err)
	}
	again := &pod{id: resp.PodSandboxId, config: &cfg, logDir: p.logDir}
	cl.stopAndRemovePod(t, again)
	return again
}

// waitSandboxState polls PodSandboxStatus until the sandbox is in state.
func (cl *criClient) waitSandboxState(t *testing.T, p *pod, state cri.PodSandboxState) {
	t.Helper()
	if err := poll(stopTimeout, func() (bool, string) {
		ctx, cancel := criCtx()
		defer cancel()
		resp, err := cl.Runtime.PodSandboxStatus(ctx, &cri.PodSandboxStatusRequest{PodSandboxId: p.id})
		if err != nil {
			return false, err.Error()
		}
		return resp.Status.State == state, fmt.Sprintf("sandbox %s is %s, want %s", p.id, resp.Status.State, state)
	}); err != nil {
		t.Fatal(err)
	}
}

// TestFaultStopInFlight: the stopping row of the fault table, the kill
// while StopContainer is in flight. The removal leaves nothing after each
// cell. Two kinds of cells:
//
//   - containerd, libvirtd or virtlogd killed and back while the guest is
//     shutting down after its power button: the container ends EXITED
//     with 0, the guest's own power-off (kubelet's StopContainer retried
//     after a failed one). The cell fails, rather than passes, when the
//     stop ended before the kill.
//   - the pod's shim or QEMU killed while the fault-injection shim is
//     held in the task's Kill before it presses the power button (step
//     "stopping": QEMU runs, the guest has not begun to power off), then
//     the shim let go. QEMU: the shim's press finds the VM shut off
//     ("crashed" to libvirt) and says the process finished; the container
//     ends EXITED with 255, QEMU's death (never 0; 134, as for a guest
//     kernel panic, before libvirt's "crashed" became 255). The shim: on 1.6
//     StopContainer fails (its Kill died with the shim) and kubelet's
//     retry succeeds, on 2.x it succeeds; CRI's wait on the task fails as
//     the shim's connection closes and it records its unknown exit, 255
//     (reason "Error"), before the TaskExit of containerd's cleanup
//     `delete` (137), which destroys the VM, arrives. The removal after
//     kubelet re-created the sandbox leaves nothing.
func TestFaultStopInFlight(t *testing.T) {
	s := requireKVM(t, "bios", "pause")
	image := s.images["bios"].ref
	s.forEachFlavourAtOnce(t, func(t *testing.T, c *containerd) {
		var cells []inFlightCell
		for _, d := range daemonFaults(c) {
			kill := d.kill
			cells = append(cells, inFlightCell{phase: "stopping", component: d.component, kill: func(t *testing.T, _ *hold, _ int, v *podContainer) {
				kill(t, v)
			}})
		}
		cells = append(cells,
			inFlightCell{phase: "stopping", step: faultpoint.Stopping, component: "shim", kill: killHeldShim},
			inFlightCell{phase: "stopping", step: faultpoint.Stopping, component: "qemu", kill: killQEMUHeld(c)})
		for _, cell := range cells {
			t.Run(cell.component, func(t *testing.T) {
				s.holdHost(t, cell.component)
				c.cleanupAfter(t)
				if cell.step != "" {
					s.useFaultShim(t)
				}
				start := time.Now()
				stopInFlightCell(t, c, image, cell)
				t.Logf("cell took %v", time.Since(start).Round(100*time.Millisecond))
			})
		}
	})
}

// stopInFlightCell runs one cell of TestFaultStopInFlight: with a step,
// the shim is held there while the component dies; without, the kill
// comes 300 ms into the stop.
func stopInFlightCell(t *testing.T, c *containerd, image string, cell inFlightCell) {
	cl := c.cri(t)
	v := c.startPodVM(t, cl, "vm-stopping-"+cell.component, image)
	var h *hold
	if cell.step != "" {
		h = holdShim(t, c, cell.step)
	}
	done := stopInBackground(cl, v.cid)
	held := 0
	if h != nil {
		held = h.waitHeld(t, done)
	} else {
		time.Sleep(300 * time.Millisecond)
		select {
		case err := <-done:
			t.Fatalf("StopContainer ended (%v) before the kill: the cell did not hit a stop in flight", err)
		default:
		}
	}
	cell.kill(t, h, held, v)
	err := <-done
	t.Logf("StopContainer in flight across %s's kill returned %v", cell.component, err)
	cl = c.cri(t)
	if err != nil {
		retryStop(t, cl, v.cid)
	}
	st := cl.waitContainerState(t, v.cid, cri.ContainerState_CONTAINER_EXITED, stopTimeout)
	t.Logf("the container is EXITED with %d (%s)", st.ExitCode, st.Reason)
	if want := stopInFlightExit[cell.component]; st.ExitCode != want {
		t.Errorf("StopContainer in flight across %s's kill: exit code %d reason %q, want %d", cell.component, st.ExitCode, st.Reason, want)
	}
	cl.removePod(t, v)
	ids := v.shimIDs()
	if cell.component == "shim" {
		ids = append(ids, shimID{nsCRI, resandboxAndRemove(t, cl, v.pod).id})
	}
	assertNothingLeft(t, c, ids...)
}

// stopInBackground starts StopContainer (kubelet's grace) and delivers
// its result: a fault cell kills a component while it is in flight.
func stopInBackground(cl *criClient, cid string) <-chan error {
	done := make(chan error, 1)
	go func() {
		ctx, cancel := criCtx()
		defer cancel()
		_, err := cl.Runtime.StopContainer(ctx, &cri.StopContainerRequest{ContainerId: cid, Timeout: criStopGrace})
		done <- err
	}()
	return done
}

// retryStop is kubelet retrying a StopContainer that failed: again each
// second until it succeeds. While containerd runs the cleanup `delete` of
// a dead shim it still has the task and a stop fails as the first did.
func retryStop(t *testing.T, cl *criClient, cid string) {
	t.Helper()
	start, tries := time.Now(), 0
	err := poll(stopTimeout, func() (bool, string) {
		tries++
		ctx, cancel := criCtx()
		defer cancel()
		_, err := cl.Runtime.StopContainer(ctx, &cri.StopContainerRequest{ContainerId: cid, Timeout: criStopGrace})
		if err != nil {
			time.Sleep(time.Second)
			return false, fmt.Sprintf("StopContainer again (as kubelet retries), %d tries: %v", tries, err)
		}
		return true, ""
	})
	if err != nil {
		t.Error(err)
		return
	}
	t.Logf("StopContainer again succeeded at try %d, %v after the first", tries, time.Since(start).Round(100*time.Millisecond))
}

// stopInFlightExit is the exit status of a container whose StopContainer
// was in flight when the component died: the guest's power-off for a
// daemon; QEMU's death for QEMU; for the shim, CRI's unknown exit (its
// wait on the task failed when the shim's connection closed).
var stopInFlightExit = map[string]int32{"containerd": 0, "libvirtd": 0, "virtlogd": 0, "qemu": 255, "shim": 255}

// killPodShim kills the one shim of this containerd (a test's one pod's).
func killPodShim(t *testing.T, c *containerd) {
	t.Helper()
	shims := c.ShimProcesses()
	if len(shims) != 1 {
		t.Fatalf("want the pod's one shim, found %v", shims)
	}
	if err := syscall.Kill(shims[0].Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
}
