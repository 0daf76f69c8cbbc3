//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/testenv"
)

// exitPanicked is a VM's exit status after its guest kernel panicked
// (docs/lifecycle.md).
const exitPanicked = 250

// testLifecycle shows the lifecycle table's rows (docs/lifecycle.md) as
// kubelet acts on them under each restartPolicy, four VM pods booting at
// once: a reboot in the guest restarts nothing (Always); a guest kernel
// panic is exit 250, restarted under Always and OnFailure and left Failed
// under Never; a power-off in the guest is exit 0, which OnFailure does
// not restart (the pod Succeeded).
func testLifecycle(t *testing.T, e *env) {
	pods := []podOpts{
		{name: "vm-always", restartPolicy: "Always"},
		{name: "vm-onfailure", restartPolicy: "OnFailure"},
		{name: "vm-never", restartPolicy: "Never"},
		{name: "vm-poweroff", restartPolicy: "OnFailure"},
	}
	for i := range pods {
		pods[i].image, pods[i].vm = kernelImage, true
		e.apply(t, pod(pods[i]))
		defer e.deletePod(t, pods[i].name)
	}
	for _, o := range pods {
		e.waitPod(t, o.name, bootTimeout, "Running", (*podStatus).running)
		e.waitAgent(t, o.name)
	}

	// A reboot: the same container, no restart.
	before := e.waitPod(t, "vm-always", shortTimeout, "Running", (*podStatus).running).container()
	e.inGuest(t, "vm-always", "reboot")
	e.waitPod(t, "vm-always", bootTimeout, "rebooted", func(p *podStatus) bool {
		out, _ := e.cluster.Kubectl(context.Background(), nil, "logs", "vm-always")
		return strings.Count(out, readyLine) >= 2
	})
	e.waitAgent(t, "vm-always")
	if c := e.waitPod(t, "vm-always", shortTimeout, "Running", (*podStatus).running).container(); c.RestartCount != 0 ||
		c.ContainerID != before.ContainerID {
		t.Errorf("after the guest's reboot: restartCount %d, container %s (was %s), want 0 and the same", c.RestartCount, c.ContainerID,
			before.ContainerID)
	}

	// A panic under each policy.
	for _, name := range []string{"vm-always", "vm-onfailure", "vm-never"} {
		e.inGuest(t, name, "echo c > /proc/sysrq-trigger")
	}
	for _, name := range []string{"vm-always", "vm-onfailure"} {
		p := e.waitPod(t, name, bootTimeout, "restarted after the panic", func(p *podStatus) bool {
			return p.container().RestartCount >= 1 && p.running()
		})
		if lt := p.container().LastState.Terminated; lt == nil || lt.ExitCode != exitPanicked {
			t.Errorf("%s: last state %+v, want terminated with %d (panicked)", name, lt, exitPanicked)
		}
	}
	p := e.waitPod(t, "vm-never", bootTimeout, "Failed", func(p *podStatus) bool { return p.Status.Phase == "Failed" })
	if c := p.container(); c.State.Terminated == nil || c.State.Terminated.ExitCode != exitPanicked || c.RestartCount != 0 {
		t.Errorf("vm-never after the panic: %v, want terminated with %d and no restart", p, exitPanicked)
	}

	// A power-off under OnFailure: exit 0, done.
	e.inGuest(t, "vm-poweroff", "poweroff")
	p = e.waitPod(t, "vm-poweroff", bootTimeout, "Succeeded", func(p *podStatus) bool { return p.Status.Phase == "Succeeded" })
	if c := p.container(); c.State.Terminated == nil || c.State.Terminated.ExitCode != 0 || c.RestartCount != 0 {
		t.Errorf("vm-poweroff after the guest's power-off: %v, want terminated with 0 and no restart", p)
	}
}

// waitAgent waits until kubectl exec reaches the pod's guest agent.
func (e *env) waitAgent(t *testing.T, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
	defer cancel()
	if err := testenv.Poll(ctx, time.Second, func() (bool, string) {
		out, err := e.cluster.Kubectl(ctx, nil, "exec", name, "--", "true")
		return err == nil, fmt.Sprintf("%q %v", out, err)
	}); err != nil {
		t.Fatalf("kubectl exec %s -- true: %v", name, err)
	}
}

// inGuest runs script in the pod's guest in the background, its output
// discarded, so that kubectl exec returns before the script reboots,
// powers off or panics the guest.
func (e *env) inGuest(t *testing.T, name, script string) {
	t.Helper()
	e.kubectl(t, "exec", name, "--", "sh", "-c", "(sleep 1; "+script+") </dev/null >/dev/null 2>&1 &")
}
