//go:build integration

package integration

import (
	"fmt"
	"os/exec"
	"syscall"
	"testing"
	"time"

	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/testenv"
)

// The host's libvirtd and virtlogd, as hack/setup-host.sh starts them
// (`/usr/sbin/NAME -d`, pid in /run/NAME.pid). Tests kill and start them
// only while the suite holds the integration lock; its descriptor is
// close-on-exec, so a daemon started here does not inherit it. Their pid:
// testenv.DaemonPid.

// killDaemon kills the host daemon with SIGKILL and waits until it is gone.
func killDaemon(t *testing.T, name string) {
	t.Helper()
	pid := testenv.DaemonPid(name)
	if pid == 0 {
		t.Fatalf("no live %s in /run/%s.pid", name, name)
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
	if err := poll(stopTimeout, func() (bool, string) {
		return syscall.Kill(pid, 0) != nil, fmt.Sprintf("%s %d still alive", name, pid)
	}); err != nil {
		t.Fatal(err)
	}
}

// startDaemon starts the host daemon as hack/setup-host.sh does and waits
// until it runs (libvirtd: until it answers).
func startDaemon(t *testing.T, name string) {
	t.Helper()
	if out, err := exec.Command("/usr/sbin/"+name, "-d").CombinedOutput(); err != nil {
		t.Fatalf("start %s: %v: %s", name, err, out)
	}
	if err := poll(time.Minute, func() (bool, string) {
		if testenv.DaemonPid(name) == 0 {
			return false, name + " has no live pid file"
		}
		if name != "libvirtd" {
			return true, ""
		}
		_, err := virsh("version")
		return err == nil, fmt.Sprint(err)
	}); err != nil {
		t.Fatal(err)
	}
}

// ensureDaemon leaves the host with the daemon running, whatever the test
// did.
func ensureDaemon(t *testing.T, name string) {
	if testenv.DaemonPid(name) == 0 {
		startDaemon(t, name)
	}
}

// startPodVM starts a VM container of image in a new pod and waits until
// its guest agent answers.
func (c *containerd) startPodVM(t *testing.T, cl *criClient, name, image string) *podContainer {
	t.Helper()
	v := c.startPodContainer(t, cl, name, "kvm", image)
	cl.waitContainerState(t, v.cid, cri.ContainerState_CONTAINER_RUNNING, bootTimeout)
	cl.waitAgentCRI(t, v.cid, bootTimeout)
	return v
}
