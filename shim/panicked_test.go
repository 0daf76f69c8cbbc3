package shim

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/containerd/containerd/api/types/task"
	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/kvm-shim/containerd-shim-kvm-v1/vm"
)

// A guest kernel panic leaves QEMU up (on_crash preserve) and libvirt
// saying "crashed": QEMU's exit never comes by itself. The shim's poll
// sees the state, destroys the domain and records the panic's own exit
// status. How soon is logged, not judged: a loaded host delays it, and
// TestCRILifecycle measures it through CRI.
func TestVMTaskGuestPanicFoundByThePoll(t *testing.T) {
	f := newVMFixture(t)
	vt := f.started()
	start := time.Now()
	f.fake.guestPanics(vt.rec.Domain)
	if got := waitExit(t, vt); got != vm.ExitPanicked {
		t.Errorf("exit %d, want %d", got, vm.ExitPanicked)
	}
	t.Logf("the panic was recorded after %v (poll every %v)", time.Since(start).Round(time.Millisecond), panicPoll)
	if !slices.Contains(f.fake.called(), "destroy "+vt.rec.Domain) {
		t.Errorf("the panicked domain was not destroyed: calls %v", f.fake.called())
	}
	if exits := f.events.exits(); len(exits) != 1 || exits[0].ExitStatus != vm.ExitPanicked {
		t.Errorf("exit events %v", exits)
	}
}

// A resync (a libvirt reconnect, a Kill that found the domain not
// running) finds a panicked guest at once; a SIGTERM to it reports the
// process finished, not a power button nobody can press.
func TestVMTaskGuestPanicFoundByResyncAndKill(t *testing.T) {
	f := newVMFixture(t)
	vt := f.started()
	f.fake.guestPanics(vt.rec.Domain)
	// The destroy ends QEMU: the watch's path reads "destroyed" and
	// records the exit before the resync's own record; it must still be
	// the panic's.
	f.fake.destroyed = func(string) {
		deadline := time.Now().Add(2 * time.Second)
		for status, _, _, _ := vt.snapshot(); status != task.Status_STOPPED && time.Now().Before(deadline); status, _, _, _ = vt.snapshot() {
			time.Sleep(5 * time.Millisecond)
		}
	}
	vt.resync(context.Background())
	if _, _, st, _ := vt.snapshot(); st != vm.ExitPanicked {
		t.Errorf("after a resync: exit %d, want %d", st, vm.ExitPanicked)
	}

	f = newVMFixture(t)
	vt = f.started()
	f.fake.guestPanics(vt.rec.Domain)
	f.fake.shutdown = func(name string) {
		// libvirt refuses the power button of a crashed domain.
		f.fake.mu.Lock()
		f.fake.doms[name].paused = true
		f.fake.mu.Unlock()
	}
	if err := vt.kill(context.Background(), uint32(unix.SIGTERM)); !errdefs.IsNotFound(err) {
		t.Errorf("SIGTERM to a panicked guest: %v, want NotFound (finished)", err)
	}
	if got := waitExit(t, vt); got != vm.ExitPanicked {
		t.Errorf("after SIGTERM: exit %d, want %d", got, vm.ExitPanicked)
	}
}
