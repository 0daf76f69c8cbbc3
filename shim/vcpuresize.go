package shim

import (
	"errors"
	"fmt"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"

	"github.com/kvm-shim/containerd-shim-kvm-v1/vm"
)

// setVCPUs (resizeMu held) brings a running VM from cur vCPUs online in
// the guest, of plugged vCPUs in QEMU, to want online. Fewer: the guest
// agent takes the highest offline (never CPU 0) and QEMU keeps their
// threads, idle, because libvirt 9.0 here cannot unplug a vCPU (the first
// unplug times out while QEMU drops the vCPU, and libvirt keeps counting
// it and fails every later unplug). More: the guest onlines those it has
// offline first, then QEMU plugs the rest and the guest onlines them as
// they appear. Each step adds its undo to undo.
func (t *vmTask) setVCPUs(l *log.Entry, cur, plugged, want int, undo *rollback) error {
	if online := min(want, plugged); online != cur {
		err := t.setGuestVCPUs(cur, online)
		undo.add(func() {
			// Only a guest whose agent answers can be put back.
			if n, gerr := t.h.conn.GuestVCPUs(t.rec.Domain); gerr == nil && n != cur {
				if rerr := t.h.conn.SetGuestVCPUs(t.rec.Domain, cur, vm.GuestVCPUTimeout); rerr != nil {
					l.WithError(rerr).Warn("put back the guest's online vCPUs of a failed resize")
				}
			}
		})
		if err != nil {
			return err
		}
	}
	if want <= plugged {
		return nil
	}
	err := t.h.conn.SetVCPUs(t.rec.Domain, want)
	// libvirt may have plugged some vCPUs before it failed.
	undo.add(func() {
		if n, cerr := t.h.conn.VCPUs(t.rec.Domain); cerr == nil && n != plugged {
			if rerr := t.h.conn.SetVCPUs(t.rec.Domain, plugged); rerr != nil {
				l.WithError(rerr).Warn("put back the vCPUs of a failed resize")
			}
		}
	})
	return err
}

// setGuestVCPUs has the guest agent put n vCPUs online (from cur) and
// checks with the agent that the guest has exactly n afterwards.
func (t *vmTask) setGuestVCPUs(cur, n int) error {
	what := "taking vCPUs offline in the guest (how a running VM gives vCPUs back)"
	if n > cur {
		what = "onlining the vCPUs the guest has offline"
	}
	err := t.h.conn.SetGuestVCPUs(t.rec.Domain, n, vm.GuestVCPUTimeout)
	if errors.Is(err, vm.ErrNoAgent) {
		return fmt.Errorf("%s needs the QEMU guest agent: %w", what, err)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	got, err := t.h.conn.GuestVCPUs(t.rec.Domain)
	if err != nil {
		return fmt.Errorf("%s: check the guest's online vCPUs: %w", what, err)
	}
	if got != n {
		return fmt.Errorf("%s: the guest has %d vCPUs online, asked for %d: %w", what, got, n, errdefs.ErrFailedPrecondition)
	}
	return nil
}
