package shim

import (
	"context"
	"fmt"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"

	"github.com/kvm-shim/containerd-shim-kvm-v1/annotations"
)

// memoryPlugTimeout is how long a resize waits for the guest to plug or
// unplug the memory asked of it before it puts the old size back. Under
// TCG here 256 MiB plug in about 1.5 s.
const memoryPlugTimeout = 20 * time.Second

// memorySize is a VM's memory as resize sees it: what it booted with, in
// its NUMA cell, and what its virtio-mem device may add, in blocks.
type memorySize struct {
	bootMiB  int // never changes live
	maxMiB   int // bootMiB plus the virtio-mem device's size
	blockMiB int // the device's block; hot-added memory is a multiple
}

// plugFor is the hot-added memory a VM needs for memMiB in all: whole
// blocks, rounded up.
func (m memorySize) plugFor(memMiB int) int {
	if memMiB <= m.bootMiB || m.blockMiB < 1 {
		return 0
	}
	return (memMiB - m.bootMiB + m.blockMiB - 1) / m.blockMiB * m.blockMiB
}

// checkMemory says why memMiB cannot be the VM's memory, naming the field.
func (m memorySize) checkMemory(id string, memMiB int) error {
	switch {
	case memMiB > m.maxMiB:
		return fmt.Errorf("resize %s: linux.resources.memory.limit asks for %d MiB of guest memory, more than the %d MiB the VM may grow to "+
			"(annotation %s, config hotplug_max_memory_mib): %w",
			id, memMiB, m.maxMiB, annotations.MaxMemoryMiB, errdefs.ErrInvalidArgument)
	case memMiB < m.bootMiB:
		return fmt.Errorf("resize %s: linux.resources.memory.limit asks for %d MiB of guest memory, below the %d MiB the guest booted with, "+
			"which it cannot give back (recreate the container): %w",
			id, memMiB, m.bootMiB, errdefs.ErrFailedPrecondition)
	}
	return nil
}

// setMemory asks the guest for plugMiB of hot-added memory and waits for
// it. A guest that does not follow in time (it cannot give back memory in
// use, or has no virtio_mem driver) gets its old request back, and the
// error says so.
func (t *vmTask) setMemory(ctx context.Context, plugMiB, oldPlugMiB int) error {
	_, err := t.h.conn.RequestMemory(t.rec.Domain, plugMiB, memoryPlugTimeout)
	if err == nil {
		return nil
	}
	if p, rerr := t.h.conn.RequestMemory(t.rec.Domain, oldPlugMiB, memoryPlugTimeout); rerr != nil {
		log.G(ctx).WithError(rerr).WithField("vm", t.rec.Domain).WithField("plugged", p.CurrentMiB).
			Warn("put back the hot-added memory of a failed resize")
	}
	return err
}

// syncMemoryLocked (resizeMu held) takes the VM's hot-added memory from
// libvirt: what it asked of the guest last.
func (t *vmTask) syncMemoryLocked(ctx context.Context, cur int) int {
	if t.mem.maxMiB <= t.mem.bootMiB {
		return cur
	}
	p, err := t.h.conn.Plugged(t.rec.Domain)
	if err != nil {
		log.G(ctx).WithError(err).WithField("vm", t.rec.Domain).Warn("read the VM's hot-added memory")
		return cur
	}
	if n := t.mem.bootMiB + p.RequestedMiB; n != cur && p.RequestedMiB != t.mem.plugFor(cur) {
		log.G(ctx).WithField("vm", t.rec.Domain).WithField("recorded", cur).WithField("live", n).
			Info("the VM's hot-added memory changed outside a resize")
		withLock(&t.mu, func() { t.memMiB = n })
		return n
	}
	return cur
}
