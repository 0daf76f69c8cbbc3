package shim

import (
	"context"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"

	"github.com/kvm-shim/containerd-shim-kvm-v1/vm"
)

// resync reads the domain's state from libvirt and records an exit that
// the QEMU watch did not (the VM stopped while Start was still running),
// or that libvirtd reported while it was away.
//
// Only a state read after the Start finished tells of the VM's exit. A
// read while Start is in flight (the resync of a libvirt reconnect that
// lands as the shim starts the domain on the new connection) finds the
// domain not yet running, "shut off, reason unknown", and onStopped,
// waiting for mu until the Start is done, would record that as the exit
// of the VM that had just started: it reported 255 and was deleted. A
// task not yet started has no exit to miss; Service.Start re-reads the
// state once its Start is done.
func (t *vmTask) resync(ctx context.Context) {
	if !t.launched.Load() {
		log.G(ctx).WithField("vm", t.rec.Domain).Debug("VM state not re-read: the task has not started (a Start in flight re-reads it when done)")
		return
	}
	st, err := t.h.conn.State(t.rec.Domain)
	switch {
	case errdefs.IsNotFound(err):
		t.onStopped(ctx, vm.StopFailed)
	case err != nil:
		log.G(ctx).WithError(err).WithField("vm", t.rec.Domain).Warn("re-read VM state")
	case st.Panicked:
		t.onPanicked(ctx)
	case !st.Running:
		t.onStopped(ctx, st.Reason)
	}
}

// exitSettle is how long after its QEMU ended a VM may still be running
// to libvirt: libvirtd reaps QEMU and records why it stopped within
// milliseconds, or, when it was away, once it is back and reconnects to
// its domains. Tests wait it out in a synctest bubble's fake time.
const exitSettle = 30 * time.Second

// followExit records the VM's exit once its QEMU has ended, with the
// reason libvirt gives. Until libvirt has the domain shut off (libvirtd
// may be away, or not yet have reaped QEMU) it asks again; after
// exitSettle the exit is recorded as what a returning libvirtd would
// report, "crashed" (onStopped decides what that counts as).
func (t *vmTask) followExit(ctx context.Context, w *vm.ExitWatch) {
	if !t.awaitQEMUEnd(ctx, w) {
		return
	}
	w.Close()
	gone := time.Now()
	wait := 10 * time.Millisecond
	for {
		if !t.live() {
			return // recorded already, or the task is gone
		}
		st, err := t.h.conn.State(t.rec.Domain)
		switch {
		case errdefs.IsNotFound(err):
			t.onStopped(ctx, vm.StopFailed)
			return
		case err == nil && !st.Running:
			t.onStopped(ctx, st.Reason)
			return
		case time.Since(gone) > exitSettle:
			log.G(ctx).WithError(err).WithField("vm", t.rec.Domain).
				Warnf("QEMU ended %v ago and libvirt does not have the domain shut off: recording the exit as libvirt's \"crashed\"", exitSettle)
			t.onStopped(ctx, vm.StopCrashed)
			return
		}
		time.Sleep(wait)
		if wait < time.Second {
			wait *= 2
		}
	}
}

// panicPoll is how often the shim asks libvirt whether its running
// guest panicked. A panic is the one end of a VM that QEMU's exit does not
// tell: the domains' on_crash keeps QEMU, paused, so that libvirt's state
// says "panicked" (with on_crash destroy libvirt ends QEMU itself and
// records the same "crashed" as for a QEMU killed by SIGKILL). It bounds
// how long a panicked guest stays before its exit is recorded; each poll
// is one lookup and one state read on the shim's libvirt connection.
const panicPoll = 2 * time.Second

// awaitQEMUEnd waits until the VM's QEMU has ended (true), and reads the
// domain's state every panicPoll meanwhile: a guest that panicked is
// destroyed and its exit recorded (false). It returns false too when
// the watch is closed (the task is deleted).
func (t *vmTask) awaitQEMUEnd(ctx context.Context, w *vm.ExitWatch) bool {
	tick := time.NewTicker(panicPoll)
	defer tick.Stop()
	for {
		select {
		case <-w.Exited():
			return true
		case <-w.Closed():
			return false
		case <-tick.C:
		}
		if !t.live() {
			return false
		}
		if !t.h.conn.Connected() {
			// A call would wake the reconnect loop past its backoff, every
			// VM's poll at once; the resync after the reconnect reads
			// the state, a panic included.
			continue
		}
		if st, err := t.h.conn.State(t.rec.Domain); err == nil && st.Panicked {
			t.onPanicked(ctx)
			w.Close()
			return false
		}
	}
}

// onPanicked ends a VM whose guest kernel panicked: libvirt holds its
// QEMU with the vCPUs stopped (on_crash preserve). It destroys the domain
// and records the panic's exit status. A failed destroy still records
// the exit: the guest is dead either way, and Delete destroys the domain
// again.
func (t *vmTask) onPanicked(ctx context.Context) {
	var live bool
	withLock(&t.mu, func() {
		live = t.liveLocked()
		t.panicked = t.panicked || live
	})
	if !live {
		return
	}
	l := log.G(ctx).WithField("vm", t.rec.Domain)
	l.WithField("exitStatus", vm.ExitPanicked).Warn("the guest's kernel panicked (its panic device reported it): destroying the VM")
	if err := t.h.conn.Destroy(t.rec.Domain); err != nil && !errdefs.IsFailedPrecondition(err) && !errdefs.IsNotFound(err) {
		l.WithError(err).Warn("destroy the panicked VM (Delete destroys it again)")
	}
	t.onStopped(ctx, vm.StopPanicked)
}

// onStopped records the exit of a running VM once and publishes it after
// the console output is drained.
func (t *vmTask) onStopped(ctx context.Context, reason vm.StopReason) {
	var live, pressed, panicked bool
	var c *console
	var pressReconnects uint64
	withLock(&t.mu, func() {
		live = t.liveLocked()
		c, pressed, pressReconnects, panicked = t.console, t.powerPressed, t.pressReconnects, t.panicked
	})
	if !live {
		return
	}
	if panicked {
		reason = vm.StopPanicked // the shim's destroy of a panicked guest, seen by any path
	}
	if reason == vm.StopCrashed && pressed && t.h.conn.Reconnects() != pressReconnects {
		// libvirtd that comes back and finds the guest powered off
		// (QEMU, run with -no-shutdown, waits for it) or QEMU gone
		// calls the domain crashed, whatever ended it: a guest asked
		// to power off, while libvirtd was away at some time since
		// the press, counts as that power-off. With libvirtd there
		// all along, "crashed" is QEMU's death (ExitStatus: 255).
		// Every path (the QEMU watch, a resync, a Kill's) decides
		// here, so none can publish QEMU's death as 0.
		log.G(ctx).WithField("vm",
			t.rec.Domain).Info("libvirt reports the VM crashed after its power button was pressed (libvirtd was away while it stopped): counted " +
			"as the power-off")
		reason = vm.StopShutdown
	}
	if c != nil {
		c.waitDrained(2 * time.Second)
	}
	oom := t.killedForMemory(ctx, reason)
	var published bool
	var status uint32
	withLock(&t.mu, func() {
		if oom && t.liveLocked() {
			t.oomLocked()
			published = t.setExitedLocked(oomKilledStatus)
		} else {
			published = t.setExitedLocked(reason.ExitStatus())
		}
		status = t.exitStatus
	})
	if published && oom {
		log.G(ctx).WithField("vm", t.rec.Domain).WithField("exitStatus", status).
			Warn("VM stopped: the kernel's OOM killer ended its QEMU (the pod's memory limit cannot hold the guest's RAM and QEMU's " +
				"overhead: declare the RuntimeClass overhead, see docs/resources.md)")
	} else if published {
		log.G(ctx).WithField("vm", t.rec.Domain).WithField("reason", reason).WithField("exitStatus", status).Info("VM stopped")
	}
}

// qemuEndWait is how long a failed call waits for the pidfd of a
// QEMU that may be dying: libvirtd can see its monitor close a moment
// before the exit is reported.
const qemuEndWait = time.Second

// qemuEnded tells whether the VM's QEMU has exited, waiting up to wait for
// its pidfd to say so.
func (t *vmTask) qemuEnded(wait time.Duration) bool {
	var w *vm.ExitWatch
	withLock(&t.mu, func() { w = t.exit })
	if w == nil {
		return false
	}
	select {
	case <-w.Exited():
		return true
	case <-time.After(wait):
		return false
	}
}
