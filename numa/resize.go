package numa

import (
	"encoding/json"
	"fmt"

	"github.com/containerd/errdefs"
)

// Resize changes the vCPUs and memory of the owner's reservation where
// it is, under the lock: a VM resized live stays on its node. Only a
// node-mode VM on one node can grow or shrink there (a dedicated VM's CPUs
// are pinned one by one, a spread VM's cells are fixed); a node without
// room for the new size is errdefs.ErrResourceExhausted, naming why, and
// nothing changes. Mode none only records the size.
func (s *Store) Resize(owner string, vcpus, memMiB int) (Placement, error) {
	if vcpus < 1 || memMiB < 1 || memMiB > maxMemoryMiB {
		return Placement{}, fmt.Errorf("resize VM %s to %d vCPUs and %d MiB: %w", owner, vcpus, memMiB, errdefs.ErrInvalidArgument)
	}
	var out Placement
	err := s.update(func(st *rawState) (bool, error) {
		i := st.find(owner)
		if i < 0 {
			return false, fmt.Errorf("VM %s holds no NUMA placement to resize: %w", owner, errdefs.ErrNotFound)
		}
		res, err := st.decode(i)
		if err != nil {
			return false, err
		}
		pl := res.Placement
		if pl.VCPUs == vcpus && pl.MemoryMiB == memMiB {
			out = pl
			return false, nil
		}
		switch {
		case pl.Mode == ModeDedicated:
			return false, fmt.Errorf("VM %s has dedicated CPUs, one per vCPU: its size cannot change live: %w", owner, errdefs.ErrFailedPrecondition)
		case len(pl.GuestNodes) > 0:
			return false, fmt.Errorf("VM %s spans %d NUMA nodes with fixed guest cells: its size cannot change live: %w", owner, len(pl.GuestNodes),
				errdefs.ErrFailedPrecondition)
		}
		sums := addToSummary(st.header.Nodes, &pl, -1)
		if pl.Mode != ModeNone && len(pl.Nodes) == 1 {
			l := newLedgerFromSummary(s.topo, s.policy, sums)
			n := l.index(pl.Nodes[0])
			if n < 0 {
				return false, fmt.Errorf("VM %s is on NUMA node %d, which this host no longer has: %w", owner, pl.Nodes[0],
					errdefs.ErrFailedPrecondition)
			}
			if ok, _, _ := l.fit(&l.nodes[n], pl.Mode, vcpus, int64(memMiB)); !ok {
				return false, fmt.Errorf("NUMA node %d has no room for VM %s with %d vCPUs and %d MiB: %s: %w",
					pl.Nodes[0], owner, vcpus, memMiB, l.reasons(pl.Mode, vcpus, int64(memMiB)), errdefs.ErrResourceExhausted)
			}
		}
		pl.VCPUs, pl.MemoryMiB = vcpus, memMiB
		res.Placement = pl
		line, err := json.Marshal(res)
		if err != nil {
			return false, err
		}
		st.lines[i] = line
		st.header.Nodes = addToSummary(sums, &pl, 1)
		out = pl
		return true, nil
	})
	return out, err
}
