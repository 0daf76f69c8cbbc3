package shim

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/containerd/namespaces"
	"github.com/containerd/containerd/runtime/v2/shim"
	"github.com/containerd/log"
	"golang.org/x/sys/unix"

	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/faultpoint"
	"github.com/kvm-shim/containerd-shim-kvm-v1/vm"
)

// RuntimeName is the containerd runtime this shim implements.
const RuntimeName = "io.containerd.kvm.v1"

// Manager is the shim binary's bootstrap side: `start` finds or starts the
// shim of a pod, `delete` cleans up after a shim that died.
type Manager struct{}

var _ shim.Manager = Manager{}

// Name returns the runtime name.
func (Manager) Name() string { return RuntimeName }

// Start returns the address of the shim serving the container's pod,
// starting one if there is none yet. Containers of one CRI pod share a
// shim (grouped by io.kubernetes.cri.sandbox-id); any other container gets
// its own.
func (Manager) Start(ctx context.Context, id string, opts shim.StartOpts) (_ string, retErr error) {
	grouping := id
	if spec, err := readSpec("."); err == nil {
		if sb := spec.Annotations[annSandboxID]; sb != "" {
			grouping = sb
		}
	}
	address, err := shim.SocketAddress(ctx, opts.Address, grouping)
	if err != nil {
		return "", err
	}
	socket, err := shim.NewSocket(address)
	if err != nil {
		if !shim.SocketEaddrinuse(err) {
			return "", fmt.Errorf("create shim socket: %w", err)
		}
		if shim.CanConnect(address) {
			// The pod's shim is already running: hand its address back.
			if err = shim.WriteAddress("address", address); err != nil {
				return "", err
			}
			return address, nil
		}
		// A stale socket from a shim that died.
		if err = shim.RemoveSocket(address); err != nil {
			return "", fmt.Errorf("remove stale shim socket: %w", err)
		}
		if socket, err = shim.NewSocket(address); err != nil {
			return "", fmt.Errorf("create shim socket: %w", err)
		}
	}
	defer func() {
		if retErr != nil {
			socket.Close()
			_ = shim.RemoveSocket(address)
		}
	}()
	if err = shim.WriteAddress("address", address); err != nil {
		return "", err
	}
	f, err := socket.File()
	if err != nil {
		return "", err
	}
	defer f.Close()

	cmd, err := serveCommand(ctx, id, opts)
	if err != nil {
		return "", err
	}
	cmd.ExtraFiles = []*os.File{f}
	if err := cmd.Start(); err != nil {
		return "", fmt.Errorf("start shim: %w", err)
	}
	go func() { _ = cmd.Wait() }()
	defer func() {
		if retErr != nil {
			_ = cmd.Process.Kill()
		}
	}()
	if err := shim.AdjustOOMScore(cmd.Process.Pid); err != nil {
		return "", fmt.Errorf("adjust shim OOM score: %w", err)
	}
	return address, nil
}

// serveCommand re-executes this binary as the long-running shim server,
// in its own process group so signals to containerd do not reach it.
func serveCommand(ctx context.Context, id string, opts shim.StartOpts) (*exec.Cmd, error) {
	ns, err := namespaces.NamespaceRequired(ctx)
	if err != nil {
		return nil, err
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cwd, err := os.Getwd()
	if err != nil {
		return nil, err
	}
	args := []string{"-namespace", ns, "-id", id, "-address", opts.Address}
	if opts.Debug {
		args = append(args, "-debug")
	}
	cmd := exec.Command(self, args...)
	cmd.Dir = cwd
	cmd.Env = serveEnv(os.Environ())
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return cmd, nil
}

// serveEnv is the shim server's environment: two Ps are plenty for a
// process that waits on sockets, and heap profiling is off from the first
// allocation (nothing reads the profile, and its bucket table costs every
// pod's shim about 150 KiB). A memprofilerate the user set is kept.
func serveEnv(environ []string) []string {
	env := make([]string, 0, len(environ)+2)
	godebug := "memprofilerate=0"
	for _, kv := range environ {
		if v, ok := strings.CutPrefix(kv, "GODEBUG="); ok {
			if strings.Contains(v, "memprofilerate=") {
				godebug = v
			} else if v != "" {
				godebug = v + "," + godebug
			}
			continue
		}
		env = append(env, kv)
	}
	return append(env, "GOMAXPROCS=2", "GODEBUG="+godebug)
}

// Stop is the cleanup `delete` that containerd runs when a task's shim is
// gone. It undoes what the task's record lists, tolerates every piece
// being gone already, and touches nothing of other containers.
func (Manager) Stop(ctx context.Context, id string) (shim.StopStatus, error) {
	cwd, err := os.Getwd()
	if err != nil {
		return shim.StopStatus{}, err
	}
	bundle := filepath.Join(filepath.Dir(cwd), id)
	status := shim.StopStatus{ExitedAt: time.Now(), ExitStatus: 128 + int(unix.SIGKILL)}
	removeDeadShimSocket(ctx, bundle)
	rec, err := readRecord(bundle)
	if err != nil {
		return status, err
	}
	if rec == nil {
		return status, nil
	}
	status.Pid = rec.Pid
	faultpoint.SetDir(rec.StateDir)
	if rec.Runc {
		ns, _ := namespaces.Namespace(ctx)
		status.Pid = stopRunc(ctx, ns, bundle, id)
	}
	switch rec.Kind {
	case kindPlain:
		return status, removeRecord(bundle)
	case kindSandbox:
		if err := releaseSandbox(ctx, layout{root: rec.StateDir}, rec, false); err != nil {
			return status, err
		}
		return status, removeRecord(bundle)
	case kindVM:
		conn, err := connectForCleanup(ctx, rec.LibvirtSocket)
		if err != nil {
			// Keep the record: the domain is still defined and a later
			// cleanup with libvirt back can finish the job. Nothing else
			// is undone meanwhile: the VM may still run on its network,
			// mounts and NUMA reservation.
			return status, fmt.Errorf("clean up VM %s: %w", rec.Domain, err)
		}
		defer conn.Close()
		return status, releaseVM(ctx, newBoundedDomains(conn), rec, bundle)
	}
	return status, fmt.Errorf("task record of %s has unknown kind %q", id, rec.Kind)
}

// removeDeadShimSocket removes the socket of the task's shim (named in
// the bundle's address file, which Start writes for every task) when no
// shim answers on it: a shim killed with SIGKILL cannot remove it, and a
// new sandbox of the pod gets a socket of another name.
func removeDeadShimSocket(ctx context.Context, bundle string) {
	b, err := os.ReadFile(filepath.Join(bundle, "address"))
	if err != nil {
		return
	}
	address := strings.TrimSpace(string(b))
	if address == "" || shim.CanConnect(address) {
		return
	}
	if err := shim.RemoveSocket(address); errors.Is(err, os.ErrNotExist) {
		return
	} else if err != nil {
		log.G(ctx).WithError(err).WithField("socket", address).Warn("remove the socket of a dead shim")
		return
	}
	log.G(ctx).WithField("socket", address).Info("removed the socket of a dead shim")
}

// cleanupConnectBudget bounds how long the cleanup waits for libvirtd:
// containerd runs it once after a shim died, with a 5 s timeout for all of
// it, and again only when it restarts. A libvirtd that restarts is back
// within it, and the rest of the 5 s is left for the release.
const cleanupConnectBudget = 2 * time.Second

// connectForCleanup connects to libvirtd, trying again while it is away
// (restarting) until the budget or ctx ends. vm.Connect honours the
// budget's deadline, so an attempt that hangs (a libvirtd that accepts but
// does not answer) ends with it.
func connectForCleanup(ctx context.Context, socket string) (*vm.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, cleanupConnectBudget)
	defer cancel()
	for {
		conn, err := vm.Connect(ctx, socket)
		if err == nil {
			return conn, nil
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(200 * time.Millisecond):
		}
	}
}
