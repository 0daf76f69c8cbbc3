package nodeinstall

import (
	"context"
	"fmt"

	"github.com/kvm-shim/containerd-shim-kvm-v1/config"
	"github.com/kvm-shim/containerd-shim-kvm-v1/numa"
)

// CapacityReader says how many floating vCPUs the node's shim admits
// (numa.VCPUCapacity): the figure the installer advertises as the
// node's numa.VCPUResource.
type CapacityReader interface {
	VCPUCapacity(ctx context.Context) (int64, error)
}

// HostCapacity reads the node's NUMA topology and the shim's config as
// the shim does (numa.ReadTopology, config.Load, Config.NUMAPolicy) and
// computes the capacity with the shim's own placement arithmetic.
type HostCapacity struct {
	// SysRoot is where the node's /sys and /proc are found: "/" in the
	// installer's container (sysfs's CPU and node trees are the host's
	// in every container).
	SysRoot string
	// ShimConfig is the path of the shim's config as the installer sees
	// it (below the host root).
	ShimConfig string
}

// VCPUCapacity implements CapacityReader.
func (h HostCapacity) VCPUCapacity(context.Context) (int64, error) {
	cfg, err := config.Load(h.ShimConfig)
	if err != nil {
		return 0, err
	}
	policy, err := cfg.NUMAPolicy()
	if err != nil {
		return 0, err
	}
	topo, err := numa.ReadTopology(h.SysRoot)
	if err != nil {
		return 0, err
	}
	n, err := numa.VCPUCapacity(topo, policy)
	if err != nil {
		return 0, fmt.Errorf("VM capacity: %w", err)
	}
	return int64(n), nil
}

// advertise sets the node's numa.VCPUResource to the shim's capacity.
// A nil Capacity advertises nothing.
func (in *Installer) advertise(ctx context.Context) (int64, error) {
	if in.Capacity == nil {
		return 0, nil
	}
	n, err := in.Capacity.VCPUCapacity(ctx)
	if err != nil {
		return 0, err
	}
	if err := in.Kube.SetNodeExtendedResource(ctx, in.Node, numa.VCPUResource, &n); err != nil {
		return 0, fmt.Errorf("advertise %s on node %s: %w", numa.VCPUResource, in.Node, err)
	}
	return n, nil
}

// withdraw removes the node's numa.VCPUResource.
func (in *Installer) withdraw(ctx context.Context) error {
	if in.Capacity == nil {
		return nil
	}
	if err := in.Kube.SetNodeExtendedResource(ctx, in.Node, numa.VCPUResource, nil); err != nil {
		return fmt.Errorf("withdraw %s from node %s: %w", numa.VCPUResource, in.Node, err)
	}
	return nil
}
