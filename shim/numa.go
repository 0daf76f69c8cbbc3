package shim

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/containerd/log"

	"github.com/kvm-shim/containerd-shim-kvm-v1/config"
	"github.com/kvm-shim/containerd-shim-kvm-v1/numa"
	"github.com/kvm-shim/containerd-shim-kvm-v1/vm"
)

// numaOwner names a reservation: the domain and the container, so the
// cleanup of an old container never releases its successor's placement.
func numaOwner(domain, containerID string) string { return domain + "/" + containerID }

// OpenNUMA reads the host topology once and opens the node's shared
// reservation store.
func OpenNUMA(cfg config.Config) (*numa.Store, error) {
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
