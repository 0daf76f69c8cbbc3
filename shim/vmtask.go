package shim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"

	"github.com/containerd/containerd/api/types/task"
	"github.com/containerd/containerd/mount"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"golang.org/x/sys/unix"

	"github.com/kvm-shim/containerd-shim-kvm-v1/cgroup"
	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/faultpoint"
	"github.com/kvm-shim/containerd-shim-kvm-v1/netfd"
	"github.com/kvm-shim/containerd-shim-kvm-v1/numa"
	"github.com/kvm-shim/containerd-shim-kvm-v1/taskio"
	"github.com/kvm-shim/containerd-shim-kvm-v1/vm"
)

// mib is a MiB in bytes.
const mib = 1 << 20

// vmTask is a container that runs as a libvirt domain. Its pid is QEMU's.
type vmTask struct {
	proc
	h        *host
	rec      taskRecord
	console  *console      // guarded by mu
	fdServer *netfd.Server // hands the VM's network descriptors to its QEMU; nil without network
	cgroup   *cgroup.Group // QEMU's cgroup (the pod's); nil for none
	// oomScoreAdj is the spec's process.oomScoreAdj (kubelet's QoS
	// policy), given to QEMU at Start as runc gives it to a container's
	// process; nil leaves QEMU's own.
	oomScoreAdj *int
	// oomKills is the cgroup's OOM kill count at Start; more at a crash
	// means the kernel killed QEMU for memory (see exitStatusFor).
	// Guarded by mu.
	oomKills uint64
	shares   int // virtiofs shares: libvirt runs a virtiofsd for each

	powerOffOnResume bool // guarded by mu: a SIGTERM came while paused
	// powerPressed: the ACPI power button was pressed (a shutdown was
	// asked). Guarded by mu.
	powerPressed bool
	// pressReconnects is the libvirt connection's reconnect count read
	// just before the press: a higher count later means libvirtd was
	// away since (see onStopped). Guarded by mu.
	pressReconnects uint64
	// panicked: libvirt said the guest's kernel panicked and the shim
	// destroys the domain; whichever path records the exit (the QEMU
	// watch sees the destroy as "destroyed") records the panic. Guarded
	// by mu.
	panicked bool
	// launched: the Start finished, the VM ran (set with RUNNING, never
	// cleared). Read without mu by resync, which must not wait for a
	// Start in flight before it asks libvirt.
	launched atomic.Bool

	agent         *vm.Agent               // guarded by mu; the guest agent client, from Start
	exit          *vm.ExitWatch           // guarded by mu; QEMU's exit, from Start
	execs         map[string]*execProcess // guarded by mu; by exec id
	vcpus, memMiB int                     // guarded by mu: the VM's size now (vCPUs online in the guest)
	plugged       int                     // guarded by mu: QEMU's vCPUs, the online ones and those the guest took offline
	maxVCPUs      int                     // what vcpus may grow to live; set at create
	mem           memorySize              // boot, maximum and block of the VM's memory; set at create
	resizeMu      sync.Mutex              // serializes update
}

// readOnlyMounts lists the places in vmDir that may be bind mounts.
func readOnlyMounts(vmDir string) []string {
	bases, _ := filepath.Glob(filepath.Join(vmDir, "base.*"))
	shares, _ := filepath.Glob(filepath.Join(vmDir, sharesDir, "*"))
	disks, _ := filepath.Glob(filepath.Join(vmDir, volumesDir, "*"))
	return append(append(append(bases, shares...), disks...), filepath.Join(vmDir, kernelFile), filepath.Join(vmDir, initrdFile))
}

func (t *vmTask) start(ctx context.Context) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.allowLocked(stepStart); err != nil {
		return 0, err
	}
	in, out, err := openStdio(ctx, t.stdio, t.id, t.rec.Namespace)
	if err != nil {
		return 0, err
	}
	ph := newPhases()
	name := t.rec.Domain
	// Start with vCPUs stopped and attach to the console first, so the
	// first line the guest prints reaches stdout.
	if err = t.h.conn.Start(name, true); err != nil {
		closeStdio(in, out)
		return 0, err
	}
	ph.mark("libvirt_create")
	faultpoint.Hold(faultpoint.LibvirtCreated)
	c, err := attachConsole(ctx, filepath.Join(t.rec.VMDir, "console.sock"), in, out)
	if err != nil {
		_ = t.h.conn.Destroy(name)
		closeStdio(in, out)
		return 0, err
	}
	ph.mark("console")
	var exit *vm.ExitWatch
	pid, err := t.h.conn.PID(name)
	if err == nil {
		exit, err = t.h.conn.WatchExit(name, pid)
	}
	if err == nil {
		// Already done in the descriptor handoff for a VM with a network.
		err = joinVMCgroup(t.cgroup, pid)
	}
	if err == nil {
		err = t.chargeVirtiofsd(ctx)
	}
	if err == nil {
		err = setOOMScoreAdj(pid, t.oomScoreAdj)
	}
	if err == nil {
		t.oomKills = t.oomKillsNow(ctx)
	}
	if err == nil {
		err = t.h.conn.Resume(name)
	}
	ph.mark("resume")
	if err != nil {
		_ = t.h.conn.Destroy(name)
		if exit != nil {
			exit.Close()
		}
		c.close()
		return 0, err
	}
	t.console = c
	t.agent = vm.NewAgent(t.h.conn, name)
	t.exit = exit
	t.setRunningLocked(pid) // onStopped checks the status under mu: an exit seen from here on follows the TaskStart
	t.launched.Store(true)
	goSafe(ctx, "follow the VM's QEMU", func() { t.followExit(context.WithoutCancel(ctx), exit) })
	t.rec.Pid = pid
	if err := writeRecord(t.bundle, &t.rec); err != nil {
		log.G(ctx).WithError(err).WithField("vm", name).Warn("update task record")
	}
	log.G(ctx).WithField("vm", name).WithField("pid", pid).WithField("took", ph.String()).Info("started VM")
	return pid, nil
}

// closeStdio closes what openStdio opened (either may be nil).
func closeStdio(in io.Closer, out *taskio.Output) {
	if in != nil {
		_ = in.Close()
	}
	if out != nil {
		_ = out.Close()
	}
}

func (t *vmTask) kill(ctx context.Context, sig uint32) error {
	paused, done, err := t.checkKill(sig)
	if done || err != nil {
		return err
	}
	s := unix.Signal(sig)
	switch {
	case s == unix.SIGKILL:
		err = t.h.conn.Destroy(t.rec.Domain)
	case isPowerButton(s):
		if paused && t.holdPowerButton(ctx) {
			return nil
		}
		// The fault tests kill QEMU or this shim here: a stop in flight,
		// before the guest has begun to power off.
		faultpoint.Hold(faultpoint.Stopping)
		reconnects := t.h.conn.Reconnects()
		err = t.h.conn.Shutdown(t.rec.Domain)
		if err == nil {
			withLock(&t.mu, func() { t.powerPressed, t.pressReconnects = true, reconnects })
		}
	default:
		return fmt.Errorf("signal %d is not supported for a VM: SIGTERM, SIGINT or SIGPWR press the ACPI power button, SIGKILL destroys it: %w",
			sig, errdefs.ErrInvalidArgument)
	}
	if errdefs.IsFailedPrecondition(err) || errdefs.IsNotFound(err) {
		// The domain may have stopped between our check and libvirt's.
		t.resync(ctx)
		if status, _, _, _ := t.snapshot(); status == task.Status_STOPPED {
			return fmt.Errorf("kill %s: process already finished: %w", t.id, errdefs.ErrNotFound)
		}
		if isPowerButton(s) && t.holdPowerButton(ctx) {
			return nil
		}
	}
	if err != nil && t.qemuEnded(qemuEndWait) {
		// QEMU died as the call reached its monitor, before libvirt had
		// the domain shut off ("Unable to read from monitor: Connection
		// reset by peer", the fault cell stopping/qemu): the process has
		// finished, and followExit records its exit once libvirt has.
		return fmt.Errorf("kill %s: process already finished (%v): %w", t.id, err, errdefs.ErrNotFound)
	}
	return err
}

// checkKill ends a task that never started (done) and otherwise checks
// that a kill can reach its VM, reporting whether the VM is paused.
func (t *vmTask) checkKill(sig uint32) (paused, done bool, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.status == task.Status_CREATED {
		// Nothing runs yet: the task just ends, as a process would.
		t.setExitedLocked(128 + sig)
		return false, true, nil
	}
	return t.status == task.Status_PAUSED, false, t.allowLocked(stepKill)
}

// isPowerButton tells the signals that press the VM's ACPI power button.
func isPowerButton(s unix.Signal) bool {
	return s == unix.SIGTERM || s == unix.SIGINT || s == unix.SIGPWR
}

// holdPowerButton handles a power button for a paused VM, which libvirt
// refuses to press. Paused by Pause (before kill or racing it), the press
// waits for Resume, as a signal to a frozen container waits for the thaw.
// Paused by QEMU itself, say on a disk I/O error, there is nothing to wait
// for; the caller goes on to SIGKILL, as after an ignored SIGTERM. It
// reports whether the VM is paused.
func (t *vmTask) holdPowerButton(ctx context.Context) bool {
	var held bool
	withLock(&t.mu, func() {
		if t.status == task.Status_PAUSED {
			t.powerOffOnResume, held = true, true
		}
	})
	if held {
		log.G(ctx).WithField("vm", t.rec.Domain).Info("VM is paused: its power button is pressed when it resumes")
		return true
	}
	if st, err := t.h.conn.State(t.rec.Domain); err == nil && st.Paused {
		log.G(ctx).WithField("vm", t.rec.Domain).Warn("VM was paused by QEMU (not by the shim) and cannot answer the power button")
		return true
	}
	return false
}

func (t *vmTask) pause(ctx context.Context) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.allowLocked(stepPause); err != nil {
		return err
	}
	if err := t.h.conn.Suspend(t.rec.Domain); err != nil {
		return err
	}
	t.setPausedLocked()
	return nil
}

func (t *vmTask) resume(ctx context.Context) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.allowLocked(stepResume); err != nil {
		return err
	}
	if err := t.h.conn.Resume(t.rec.Domain); err != nil {
		return err
	}
	t.setResumedLocked()
	if t.powerOffOnResume {
		t.powerOffOnResume = false
		reconnects := t.h.conn.Reconnects()
		if err := t.h.conn.Shutdown(t.rec.Domain); err != nil {
			log.G(ctx).WithError(err).WithField("vm", t.rec.Domain).Warn("press the power button held while paused")
		} else {
			t.powerPressed, t.pressReconnects = true, reconnects
		}
	}
	return nil
}

func (t *vmTask) stats(ctx context.Context) (vm.Stats, error) {
	if err := t.allow(stepStats); err != nil {
		return vm.Stats{}, err
	}
	st, err := t.h.conn.Stats(t.rec.Domain)
	if errdefs.IsFailedPrecondition(err) || errdefs.IsNotFound(err) {
		// The VM stopped (or is stopping) and its exit has not been
		// recorded yet: to containerd a task whose process is gone
		// has no stats (NotFound, which its metrics collection skips
		// quietly; FailedPrecondition it logs as an error on every exit).
		return vm.Stats{}, fmt.Errorf("stats %s: the VM is not running (%v): %w", t.id, err, errdefs.ErrNotFound)
	}
	if err == nil && t.mem.maxMiB > t.mem.bootMiB {
		// libvirt counts the whole virtio-mem device as the guest's
		// memory; the guest has its boot memory and what is plugged.
		withLock(&t.mu, func() { st.MemoryBytes = uint64(t.mem.bootMiB+t.mem.plugFor(t.memMiB)) * mib })
	}
	return st, err
}

// endForDelete ends a task that is not running for its Delete and takes
// what the task holds open, for the caller to close.
func (t *vmTask) endForDelete() (*console, *netfd.Server, *vm.ExitWatch, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.allowLocked(stepDelete); err != nil {
		return nil, nil, nil, err
	}
	t.setDeletedLocked()
	c, srv, exit := t.console, t.fdServer, t.exit
	t.console, t.fdServer, t.exit = nil, nil, nil
	return c, srv, exit, nil
}

// delete tears down everything the task made. A running VM must be killed
// first, as with any task.
func (t *vmTask) delete(ctx context.Context) error {
	c, srv, exit, err := t.endForDelete()
	if err != nil {
		return err
	}
	if exit != nil {
		exit.Close()
	}
	if c != nil {
		c.close()
	}
	if srv != nil {
		_ = srv.Close()
	}
	t.abandonExecs()
	return releaseVM(ctx, t.h.conn, &t.rec, t.bundle)
}

// releaseNUMA gives the VM's host CPUs and memory back to the node.
func releaseNUMA(rec *taskRecord) error {
	if rec.NUMAOwner == "" {
		return nil
	}
	topo, err := numa.ReadTopology("/")
	if err != nil {
		return err
	}
	store, err := numa.OpenStore(rec.NUMAStore, topo, numa.Policy{})
	if err != nil {
		return err
	}
	return store.Release(rec.NUMAOwner)
}

// removeFDSocket removes the socket a VM's wrapper fetches descriptors
// from (it is named after the domain; a dead shim left it behind).
func removeFDSocket(rec *taskRecord) error {
	if rec.Network == nil {
		return nil
	}
	if err := os.Remove(netfd.SocketPath(netfd.SocketDir, rec.Domain)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// releaseVM undoes everything a VM task made, as written in its record:
// it is shared by a live Delete and by the cleanup `delete` containerd
// runs after a shim died. Every piece may already be gone. The domain is
// only touched while it still belongs to this container: a restarted
// container of the same pod reuses the name.
func releaseVM(ctx context.Context, conn domains, rec *taskRecord, bundle string) error {
	if b, ok := conn.(*boundedDomains); ok && !b.waitAnswering(changeBound) {
		// Each call below fails at once; the record stays for a retry.
		log.G(ctx).WithField("vm", rec.Domain).Warnf("libvirtd has not answered for %v: releasing the VM fails", changeBound)
	}
	var errs []error
	successor := false // the domain's name is a newer container's now
	if rec.Domain != "" {
		m, err := conn.Metadata(rec.Domain)
		switch {
		case errdefs.IsNotFound(err):
			errs = append(errs, removeFDSocket(rec))
		case err != nil:
			errs = append(errs, err)
		case m.ContainerID != rec.ID:
			successor = true
			log.G(ctx).WithField("vm", rec.Domain).WithField("owner", m.ContainerID).Info("domain now belongs to another container; leaving it")
		default:
			if st, err := conn.State(rec.Domain); err == nil && st.Running {
				if err := conn.Destroy(rec.Domain); err != nil && !errdefs.IsFailedPrecondition(err) {
					errs = append(errs, err)
				}
			}
			faultpoint.Hold(faultpoint.ReleaseUndefine)
			errs = append(errs, conn.Undefine(rec.Domain))
			errs = append(errs, removeFDSocket(rec))
		}
	}
	errs = append(errs, removeVMCgroup(rec))
	errs = append(errs, teardownNetwork(rec.Network))
	errs = append(errs, releaseNUMA(rec))
	if rec.KeepOverlay && rec.Overlay != "" && !successor {
		errs = append(errs, takeBack(rec.Identity, rec.Overlay, filepath.Dir(rec.Overlay)))
	}
	errs = append(errs, releaseIdentity(rec))
	if rec.VMDir != "" {
		errs = append(errs, removeVMDir(rec.VMDir))
	}
	if rec.Overlay != "" && !rec.KeepOverlay {
		for _, f := range vm.OverlayFiles(rec.Overlay) {
			if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	// The rootfs dir can go between UnmountAll's check and its unmount
	// (containerd's cleanup after its restart racing the live shim's
	// Delete, seen in TestFaultInFlight): nothing is mounted on a dir that
	// is gone.
	if err := mount.UnmountAll(filepath.Join(bundle, "rootfs"), unix.MNT_DETACH); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, fmt.Errorf("unmount rootfs: %w", err))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("release VM %s: %w", rec.Domain, err)
	}
	return removeRecord(bundle)
}
