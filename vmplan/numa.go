package vmplan

import (
	"fmt"
	"strings"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/kvm-shim/containerd-shim-kvm-v1/annotations"
	"github.com/kvm-shim/containerd-shim-kvm-v1/config"
	"github.com/kvm-shim/containerd-shim-kvm-v1/numa"
	"github.com/kvm-shim/containerd-shim-kvm-v1/vm"
)

// NUMAMode is the placement the pod asks for: the annotation, else the
// config's numa_mode.
func NUMAMode(spec *specs.Spec, cfg config.Config) (numa.Mode, error) {
	v, ok := spec.Annotations[annotations.NUMAMode]
	if !ok {
		v = cfg.NUMAMode
	}
	m, err := numa.ParseMode(strings.TrimSpace(v))
	if err != nil {
		return "", fmt.Errorf("annotation %s: %w", annotations.NUMAMode, err)
	}
	return m, nil
}

// Pinning turns a placement into the domain's Pinning.
func Pinning(p numa.Placement) *vm.Pinning {
	if p.Mode == numa.ModeNone {
		return nil
	}
	out := &vm.Pinning{CPUSet: p.CPUs, EmulatorCPUs: p.EmulatorCPUs, MemoryNodes: p.Nodes}
	for _, c := range p.VCPUPins {
		out.VCPUPins = append(out.VCPUPins, []int{c})
	}
	if len(p.GuestNodes) == 0 {
		return out
	}
	// A VM spread over nodes: each guest cell's vCPUs float over the CPUs
	// of the host node that holds the cell's memory.
	out.CPUSet, out.VCPUPins = nil, make([][]int, p.VCPUs)
	for _, g := range p.GuestNodes {
		out.Cells = append(out.Cells, vm.Cell{HostNode: g.HostNode, VCPUs: g.VCPUs, MemoryMiB: g.MemoryMiB})
		out.CPUSet = append(out.CPUSet, g.CPUs...)
		for _, v := range g.VCPUs {
			if v >= 0 && v < len(out.VCPUPins) {
				out.VCPUPins[v] = g.CPUs
			}
		}
	}
	return out
}

// HugePageKiB reads the OCI spec's hugepage limits: the first page size
// with a positive limit backs the guest.
func HugePageKiB(spec *specs.Spec) (uint64, error) {
	r := resources(spec)
	if r == nil {
		return 0, nil
	}
	for _, h := range r.HugepageLimits {
		if h.Limit == 0 {
			continue
		}
		switch strings.ToUpper(h.Pagesize) {
		case "2MB":
			return 2048, nil
		case "1GB":
			return 1 << 20, nil
		}
		return 0, fmt.Errorf("linux.resources.hugepageLimits: page size %q is not supported (2MB or 1GB): %w", h.Pagesize,
			errdefs.ErrInvalidArgument)
	}
	return 0, nil
}
