package shim

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/kvm-shim/containerd-shim-kvm-v1/annotations"
	"github.com/kvm-shim/containerd-shim-kvm-v1/config"
	"github.com/kvm-shim/containerd-shim-kvm-v1/numa"
	"github.com/kvm-shim/containerd-shim-kvm-v1/vm"
)

// numaOwner names a reservation: the domain and the container, so the
// cleanup of an old container never releases its successor's placement.
func numaOwner(domain, containerID string) string { return domain + "/" + containerID }

// openNUMA reads the host topology once and opens the node's shared
// reservation store.
func openNUMA(cfg config.Config) (*numa.Store, error) {
	topo, err := numa.ReadTopology("/")
	if err != nil {
		return nil, fmt.Errorf("read NUMA topology: %w", err)
	}
	policy, err := cfg.NUMAPolicy()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(cfg.NUMAStateFile), 0o711); err != nil {
		return nil, fmt.Errorf("create NUMA state dir: %w", err)
	}
	return numa.OpenStore(cfg.NUMAStateFile, topo, policy)
}

// reconcileNUMA rebuilds the reservations from the domains libvirt knows,
// so a shim that crashed between reserving and deleting leaks nothing. The
// domains are listed under the store's lock (see numa.Store.ReconcileWith):
// a cleanup delete running meanwhile undefines its domain before it
// releases the reservation.
func reconcileNUMA(ctx context.Context, store *numa.Store, domains func() (map[string]vm.Metadata, error)) error {
	dropped, err := store.ReconcileWith(func() ([]numa.Placement, error) {
		doms, err := domains()
		if err != nil {
			return nil, fmt.Errorf("list domains: %w", err)
		}
		return livePlacements(ctx, doms), nil
	})
	if len(dropped) > 0 {
		log.G(ctx).WithField("owners", dropped).Info("released NUMA reservations of VMs that are gone")
	}
	return err
}

// livePlacements are the placements in the metadata of doms.
func livePlacements(ctx context.Context, doms map[string]vm.Metadata) []numa.Placement {
	var live []numa.Placement
	for name, m := range doms {
		if m.NUMA == "" {
			continue
		}
		var p numa.Placement
		if err := json.Unmarshal([]byte(m.NUMA), &p); err != nil {
			log.G(ctx).WithError(err).WithField("vm", name).Warn("unreadable NUMA placement in domain metadata")
			continue
		}
		live = append(live, p)
	}
	return live
}

func numaMode(spec *specs.Spec, cfg config.Config) (numa.Mode, error) {
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

// pinning turns a placement into the domain's pinning.
func pinning(p numa.Placement) *vm.Pinning {
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

// hugePageKiB reads the OCI spec's hugepage limits: the first page size
// with a positive limit backs the guest.
func hugePageKiB(spec *specs.Spec) (uint64, error) {
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
