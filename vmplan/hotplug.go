package vmplan

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/kvm-shim/containerd-shim-kvm-v1/annotations"
	"github.com/kvm-shim/containerd-shim-kvm-v1/config"
	"github.com/kvm-shim/containerd-shim-kvm-v1/numa"
)

// HotplugMaxVCPUs is the most vCPUs a VM of vcpus may have live: the
// annotation, else the config's hotplug_max_vcpus, never below vcpus. A
// dedicated VM pins each vCPU to its own host CPU and cannot grow.
func HotplugMaxVCPUs(spec *specs.Spec, cfg config.Config, vcpus int, mode numa.Mode) (int, error) {
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

// HotplugMaxMemoryMiB is the most memory a VM of memMiB may have live: the
// annotation, else the config's hotplug_max_memory_mib, never below
// memMiB. A dedicated VM's reservation cannot change live.
func HotplugMaxMemoryMiB(spec *specs.Spec, cfg config.Config, memMiB int, mode numa.Mode) (int, error) {
	return hotplugMax(spec, hotplugLimit{annotations.MaxMemoryMiB, "MiB", "max_memory_mib", cfg.MaxMemoryMiB, cfg.HotplugMaxMemoryMiB}, memMiB,
		mode)
}

// ResizeTarget is what a resize asks of a VM.
type ResizeTarget struct{ VCPUs, MemMiB int }

// ResizeTargetFrom reads the VM's new size from updated resources, as
// Create reads it from the spec: CPU quota/period rounded up to whole
// vCPUs, the memory limit in MiB. What the update leaves out (or sets
// unlimited) stays as it is.
func ResizeTargetFrom(r *specs.LinuxResources, vcpus, memMiB int) ResizeTarget {
	t := ResizeTarget{VCPUs: vcpus, MemMiB: memMiB}
	if c := r.CPU; c != nil && c.Quota != nil && *c.Quota > 0 && c.Period != nil && *c.Period > 0 {
		q, p := uint64(*c.Quota), *c.Period
		t.VCPUs = int((q + p - 1) / p)
	}
	if m := r.Memory; m != nil && m.Limit != nil && *m.Limit > 0 {
		t.MemMiB = int((*m.Limit + mib - 1) / mib)
	}
	return t
}
