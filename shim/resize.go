package shim

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/kvm-shim/containerd-shim-kvm-v1/annotations"
	"github.com/kvm-shim/containerd-shim-kvm-v1/vmplan"
)

// resources decodes the LinuxResources of a task update (containerd
// sends them as JSON under runtime-spec's type URL).
func updateResources(a *anypb.Any) (*specs.LinuxResources, error) {
	if a == nil || !strings.HasSuffix(a.GetTypeUrl(), "/LinuxResources") {
		return nil, fmt.Errorf("update carries %q, not LinuxResources: %w", a.GetTypeUrl(), errdefs.ErrInvalidArgument)
	}
	var r specs.LinuxResources
	if err := json.Unmarshal(a.GetValue(), &r); err != nil {
		return nil, fmt.Errorf("decode LinuxResources: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	return &r, nil
}

// update resizes a running VM live: vCPUs follow the CPU limit (fewer are
// taken offline in the guest, more are onlined there or plugged into QEMU
// up to its maximum; see setVCPUs), hot-added memory (virtio-mem) follows
// the memory limit between the boot memory and the maximum, and the
// node's NUMA reservation follows both. Everything is checked first; a
// step that fails undoes the ones before, so the VM is never left
// half-resized.
func (t *vmTask) update(ctx context.Context, r *specs.LinuxResources) error {
	t.resizeMu.Lock() // one resize at a time; mu stays free for kill and stats
	defer t.resizeMu.Unlock()
	var err error
	var cur, plugged, mem int
	withLock(&t.mu, func() { err, cur, plugged, mem = t.allowLocked(stepResize), t.vcpus, t.plugged, t.memMiB })
	if err != nil {
		return err
	}
	cur, plugged = t.syncVCPUsLocked(ctx, cur, plugged)
	mem = t.syncMemoryLocked(ctx, mem)
	want := vmplan.ResizeTargetFrom(r, cur, mem)
	if err := t.mem.checkMemory(t.id, want.MemMiB); err != nil {
		return err
	}
	switch {
	case want.VCPUs > t.maxVCPUs:
		return fmt.Errorf("resize %s: linux.resources.cpu asks for %d vCPUs, more than the %d the VM may grow to (annotation %s, config "+
			"hotplug_max_vcpus): %w",
			t.id, want.VCPUs, t.maxVCPUs, annotations.MaxVCPUs, errdefs.ErrInvalidArgument)
	case want.VCPUs == cur && want.MemMiB == mem:
		return nil
	}
	l := log.G(ctx).WithField("vm", t.rec.Domain).WithField("from", cur).WithField("to", want.VCPUs).WithField("plugged", plugged).
		WithField("fromMiB", mem).WithField("toMiB", want.MemMiB)
	var undo rollback
	if t.rec.NUMAOwner != "" && t.h.numa != nil {
		if _, err := t.h.numa.Resize(t.rec.NUMAOwner, want.VCPUs, want.MemMiB); err != nil {
			return fmt.Errorf("resize %s: %w", t.id, err)
		}
		undo.add(func() {
			if _, err := t.h.numa.Resize(t.rec.NUMAOwner, cur, mem); err != nil {
				l.WithError(err).Warn("give back the NUMA reservation of a failed resize")
			}
		})
	}
	if want.VCPUs != cur {
		if err := t.setVCPUs(l, cur, plugged, want.VCPUs, &undo); err != nil {
			undo.run()
			return fmt.Errorf("resize %s to %d vCPUs (linux.resources.cpu): %w", t.id, want.VCPUs, err)
		}
	}
	if plug, old := t.mem.plugFor(want.MemMiB), t.mem.plugFor(mem); plug != old {
		if err := t.setMemory(ctx, plug, old); err != nil {
			undo.run()
			return fmt.Errorf("resize %s to %d MiB (linux.resources.memory.limit): %w", t.id, want.MemMiB, err)
		}
	}
	withLock(&t.mu, func() { t.vcpus, t.plugged, t.memMiB = want.VCPUs, max(plugged, want.VCPUs), want.MemMiB })
	l.Info("resized VM")
	return nil
}

// syncVCPUsLocked (resizeMu held) takes QEMU's vCPU count from libvirt
// when it differs from plugged: a plug libvirt completed after an earlier
// resize gave up on it (the guest onlines such vCPUs itself). It returns
// the VM's online and plugged vCPUs; the NUMA reservation follows.
func (t *vmTask) syncVCPUsLocked(ctx context.Context, cur, plugged int) (int, int) {
	n, err := t.h.conn.VCPUs(t.rec.Domain)
	if err != nil || n < 1 || n == plugged {
		return cur, plugged
	}
	online := min(cur, n)
	if n > plugged {
		online = cur + n - plugged
	}
	log.G(ctx).WithField("vm", t.rec.Domain).WithField("recorded", plugged).WithField("live", n).WithField("online", online).
		Info("QEMU's vCPUs changed after a resize gave up on them")
	if t.rec.NUMAOwner != "" && t.h.numa != nil {
		var mem int
		withLock(&t.mu, func() { mem = t.memMiB })
		if _, err := t.h.numa.Resize(t.rec.NUMAOwner, online, mem); err != nil {
			log.G(ctx).WithError(err).WithField("vm", t.rec.Domain).Warn("NUMA reservation of the VM's live vCPUs")
		}
	}
	withLock(&t.mu, func() { t.vcpus, t.plugged = online, n })
	return online, n
}
