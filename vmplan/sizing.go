package vmplan

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/kvm-shim/containerd-shim-kvm-v1/annotations"
	"github.com/kvm-shim/containerd-shim-kvm-v1/config"
)

const (
	maxKernelCmdline = 2048 // x86 COMMAND_LINE_SIZE
	mib              = 1 << 20
)

// Size picks vCPUs and memory: an annotation wins, else the OCI spec's
// CPU quota/period and memory limit (as kubelet sets them from the
// container's limits), else the config's defaults.
func Size(spec *specs.Spec, cfg config.Config) (vcpus, memoryMiB int, err error) {
	vcpus, memoryMiB = cfg.DefaultVCPUs, cfg.DefaultMemoryMiB
	if r := resources(spec); r != nil {
		if c := r.CPU; c != nil && c.Quota != nil && *c.Quota > 0 && c.Period != nil && *c.Period > 0 {
			q, p := uint64(*c.Quota), *c.Period
			vcpus = int((q + p - 1) / p)
			if vcpus > cfg.MaxVCPUs {
				return 0, 0, fmt.Errorf("linux.resources.cpu quota %d/period %d asks for %d vCPUs, more than max_vcpus %d: %w", q, p, vcpus,
					cfg.MaxVCPUs, errdefs.ErrInvalidArgument)
			}
		}
		if m := r.Memory; m != nil && m.Limit != nil && *m.Limit > 0 {
			memoryMiB = int((*m.Limit + mib - 1) / mib)
			if err := checkMemory(memoryMiB, cfg, "linux.resources.memory.limit"); err != nil {
				return 0, 0, err
			}
		}
	}
	if v, ok := spec.Annotations[annotations.VCPUs]; ok {
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil || n < 1 || n > cfg.MaxVCPUs {
			return 0, 0, fmt.Errorf("annotation %s = %q: want a whole number from 1 to %d: %w", annotations.VCPUs, v, cfg.MaxVCPUs,
				errdefs.ErrInvalidArgument)
		}
		vcpus = n
	}
	if v, ok := spec.Annotations[annotations.Memory]; ok {
		b, err := ParseSize(v)
		if err != nil {
			return 0, 0, fmt.Errorf("annotation %s = %q: %v: %w", annotations.Memory, v, err, errdefs.ErrInvalidArgument)
		}
		memoryMiB = int((b + mib - 1) / mib)
		if err := checkMemory(memoryMiB, cfg, "annotation "+annotations.Memory); err != nil {
			return 0, 0, err
		}
	}
	return vcpus, memoryMiB, nil
}

// resources is the spec's linux.resources, nil when it sets none.
func resources(spec *specs.Spec) *specs.LinuxResources {
	if spec.Linux == nil {
		return nil
	}
	return spec.Linux.Resources
}

// checkMemory refuses guest memory outside the config's bounds, naming
// source, the field that asked for it.
func checkMemory(m int, cfg config.Config, source string) error {
	if m < config.MinMemoryMiB || m > cfg.MaxMemoryMiB {
		return fmt.Errorf("%s gives %d MiB of guest memory; want %d to %d MiB: %w", source, m, config.MinMemoryMiB, cfg.MaxMemoryMiB,
			errdefs.ErrInvalidArgument)
	}
	return nil
}

var sizeSuffixes = []struct {
	suffix string
	factor int64
}{
	{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}, {"Ti", 1 << 40},
	{"k", 1e3}, {"M", 1e6}, {"G", 1e9}, {"T", 1e12},
}

// ParseSize reads a whole-number size with an optional Kubernetes suffix.
func ParseSize(s string) (int64, error) {
	s = strings.TrimSpace(s)
	factor := int64(1)
	for _, u := range sizeSuffixes {
		if strings.HasSuffix(s, u.suffix) {
			s, factor = strings.TrimSuffix(s, u.suffix), u.factor
			break
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("want a size such as 512Mi, 2Gi or a number of bytes")
	}
	if n > (1<<62)/factor {
		return 0, fmt.Errorf("size is too large")
	}
	return n * factor, nil
}

// KernelCmdline returns the command line for a direct kernel boot.
func KernelCmdline(spec *specs.Spec, cfg config.Config) (string, error) {
	v, ok := spec.Annotations[annotations.KernelCmdline]
	if !ok {
		return cfg.KernelCmdline, nil
	}
	if len(v) > maxKernelCmdline || strings.ContainsAny(v, "\x00\n\r") {
		return "", fmt.Errorf("annotation %s: want one line of at most %d bytes: %w", annotations.KernelCmdline, maxKernelCmdline,
			errdefs.ErrInvalidArgument)
	}
	return v, nil
}
