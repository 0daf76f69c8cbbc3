package nodeinstall

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
)

// Restarter restarts the node's containerd and returns once it serves
// again. Running containers and VMs are not touched by a containerd
// restart: their shims keep running and containerd reconnects to them.
type Restarter interface {
	Restart(ctx context.Context) error
}

// SystemdRestarter restarts a systemd unit on the node from inside the
// installer's container: the host's own systemctl, chrooted into the
// host root, asks systemd over its socket in the host's /run (the pod
// needs hostPID: systemctl refuses to act when its / is not pid 1's).
// The installer's image carries no systemctl or nsenter of its own.
type SystemdRestarter struct {
	// HostRoot is where the node's root is mounted.
	HostRoot string
	Unit     string
	// Socket is containerd's socket as the installer sees it (below the
	// host root); Restart waits until it accepts a connection.
	Socket string
}

// Restart implements Restarter.
func (r SystemdRestarter) Restart(ctx context.Context) error {
	cmd := exec.CommandContext(ctx, "/usr/bin/systemctl", "restart", r.Unit)
	cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: r.HostRoot}
	cmd.Dir = "/"
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("systemctl restart %s: %w: %s", r.Unit, err, strings.TrimSpace(string(out)))
	}
	return waitSocket(ctx, r.Socket)
}

// PidFileRestarter stops containerd with SIGTERM to the pid in a pid
// file and waits for its supervisor (an init system without systemd,
// s6, runit, a test harness) to start a new one that writes its pid
// there.
type PidFileRestarter struct {
	// PidFile and Socket as the installer sees them (below the host root).
	PidFile, Socket string
	// Timeout bounds the wait for the new containerd; 0 means 2 minutes.
	Timeout time.Duration
}

func readPid(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 1 {
		return 0, fmt.Errorf("pid file %s holds %q, not a pid: %w", path, strings.TrimSpace(string(b)), errdefs.ErrInvalidArgument)
	}
	return pid, nil
}

// Restart implements Restarter.
func (r PidFileRestarter) Restart(ctx context.Context) error {
	old, err := readPid(r.PidFile)
	if err != nil {
		return fmt.Errorf("restart containerd: %w", err)
	}
	timeout := r.Timeout
	if timeout == 0 {
		timeout = 2 * time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := syscall.Kill(old, syscall.SIGTERM); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("restart containerd: signal pid %d: %w", old, err)
	}
	log.G(ctx).WithField("pid", old).Info("sent SIGTERM to containerd; waiting for its supervisor to start it again")
	for {
		if pid, err := readPid(r.PidFile); err == nil && pid != old && syscall.Kill(pid, 0) == nil {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("restart containerd: no new containerd in %s %s: %w", r.PidFile, timeout, errdefs.ErrUnavailable)
		case <-time.After(200 * time.Millisecond):
		}
	}
	return waitSocket(ctx, r.Socket)
}

// waitSocket waits until a unix socket accepts a connection.
func waitSocket(ctx context.Context, path string) error {
	var d net.Dialer
	for {
		c, err := d.DialContext(ctx, "unix", path)
		if err == nil {
			return c.Close()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("containerd socket %s: %w", path, errors.Join(err, ctx.Err()))
		case <-time.After(200 * time.Millisecond):
		}
	}
}
