package shim

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/containerd/containerd/api/types/task"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/kvm-shim/containerd-shim-kvm-v1/annotations"
	"github.com/kvm-shim/containerd-shim-kvm-v1/config"
	"github.com/kvm-shim/containerd-shim-kvm-v1/numa"
)

// hotplugMaxVCPUs is the most vCPUs a VM of vcpus may have live: the
// annotation, else the config's hotplug_max_vcpus, never below vcpus. A
// dedicated VM pins each vCPU to its own host CPU and cannot grow.
func hotplugMaxVCPUs(spec *specs.Spec, cfg config.Config, vcpus int, mode numa.Mode) (int, error) {
	return hotplugMax(spec, hotplugLimit{annotations.MaxVCPUs, "vCPUs", "max_vcpus", cfg.MaxVCPUs, cfg.HotplugMaxVCPUs}, vcpus, mode)
}

// hotplugLimit is one resource a VM may grow live: its annotation, its
// unit, and the config's bound and default.
type hotplugLimit struct {
	annotation, unit, boundKey string
	bound, def                 int
}

// hotplugMax is the most of a resource a VM starting with cur may have
// live: the annotation (a whole number from cur to the bound), else the
// config's default, never below cur. A dedicated VM's reservation cannot
// change live, so it gets cur.
func hotplugMax(spec *specs.Spec, l hotplugLimit, cur int, mode numa.Mode) (int, error) {
	v, ok := spec.Annotations[l.annotation]
	if !ok {
		if mode == numa.ModeDedicated {
			return cur, nil
		}
		return max(cur, l.def), nil
	}
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil || n < cur || n > l.bound {
		return 0, fmt.Errorf("annotation %s = %q: want a whole number from the VM's %d %s to %s %d: %w", l.annotation, v, cur, l.unit, l.boundKey,
			l.bound, errdefs.ErrInvalidArgument)
	}
	if n > cur && mode == numa.ModeDedicated {
		return 0, fmt.Errorf("annotation %s = %q: a VM in numa-mode dedicated cannot grow its %s live: %w", l.annotation, v, l.unit,
			errdefs.ErrInvalidArgument)
	}
	return n, nil
}

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

// vmSize is what a resize asks of a VM.
type resizeTarget struct{ vcpus, memMiB int }

// resizeTargetFrom reads the VM's new size from updated resources, as
// Create reads it from the spec: CPU quota/period rounded up to whole
// vCPUs, the memory limit in MiB. What the update leaves out (or sets
// unlimited) stays as it is.
func resizeTargetFrom(r *specs.LinuxResources, vcpus, memMiB int) resizeTarget {
	t := resizeTarget{vcpus: vcpus, memMiB: memMiB}
	if c := r.CPU; c != nil && c.Quota != nil && *c.Quota > 0 && c.Period != nil && *c.Period > 0 {
		q, p := uint64(*c.Quota), *c.Period
		t.vcpus = int((q + p - 1) / p)
	}
	if m := r.Memory; m != nil && m.Limit != nil && *m.Limit > 0 {
		t.memMiB = int((*m.Limit + mib - 1) / mib)
	}
	return t
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
	var status task.Status
	var cur, plugged, mem int
	withLock(&t.mu, func() { status, cur, plugged, mem = t.status, t.vcpus, t.plugged, t.memMiB })
	if status != task.Status_RUNNING {
		return fmt.Errorf("resize %s: the VM is %s; only a running VM is resized live: %w", t.id, strings.ToLower(status.String()),
			errdefs.ErrFailedPrecondition)
	}
	cur, plugged = t.syncVCPUsLocked(ctx, cur, plugged)
	mem = t.syncMemoryLocked(ctx, mem)
	want := resizeTargetFrom(r, cur, mem)
	if err := t.mem.checkMemory(t.id, want.memMiB); err != nil {
		return err
	}
	switch {
	case want.vcpus > t.maxVCPUs:
		return fmt.Errorf("resize %s: linux.resources.cpu asks for %d vCPUs, more than the %d the VM may grow to (annotation %s, config "+
			"hotplug_max_vcpus): %w",
			t.id, want.vcpus, t.maxVCPUs, annotations.MaxVCPUs, errdefs.ErrInvalidArgument)
	case want.vcpus == cur && want.memMiB == mem:
		return nil
	}
	l := log.G(ctx).WithField("vm", t.rec.Domain).WithField("from", cur).WithField("to", want.vcpus).WithField("plugged", plugged).
		WithField("fromMiB", mem).WithField("toMiB", want.memMiB)
	var undo rollback
	if t.rec.NUMAOwner != "" && t.h.numa != nil {
		if _, err := t.h.numa.Resize(t.rec.NUMAOwner, want.vcpus, want.memMiB); err != nil {
			return fmt.Errorf("resize %s: %w", t.id, err)
		}
		undo.add(func() {
			if _, err := t.h.numa.Resize(t.rec.NUMAOwner, cur, mem); err != nil {
				l.WithError(err).Warn("give back the NUMA reservation of a failed resize")
			}
		})
	}
	if want.vcpus != cur {
		if err := t.setVCPUs(l, cur, plugged, want.vcpus, &undo); err != nil {
			undo.run()
			return fmt.Errorf("resize %s to %d vCPUs (linux.resources.cpu): %w", t.id, want.vcpus, err)
		}
	}
	if plug, old := t.mem.plugFor(want.memMiB), t.mem.plugFor(mem); plug != old {
		if err := t.setMemory(ctx, plug, old); err != nil {
			undo.run()
			return fmt.Errorf("resize %s to %d MiB (linux.resources.memory.limit): %w", t.id, want.memMiB, err)
		}
	}
	withLock(&t.mu, func() { t.vcpus, t.plugged, t.memMiB = want.vcpus, max(plugged, want.vcpus), want.memMiB })
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
