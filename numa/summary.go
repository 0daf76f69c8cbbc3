package numa

import (
	"cmp"
	"slices"
)

// nodeSummary is what the placements hold on one node, kept in the state
// file beside them so that Reserve and Release decide and update from the
// few node summaries instead of decoding every placement. It counts
// exactly what ledger.charge counts; Reconcile recomputes it from scratch.
type nodeSummary struct {
	Node int `json:"node"`
	// VCPUs are floating vCPUs (node mode, spread cells).
	VCPUs     int   `json:"vcpus"`
	MemoryMiB int64 `json:"memoryMiB"`
	VMs       int   `json:"vms"`
	// Dedicated are the CPUs held by dedicated VMs on the node.
	Dedicated CPUList `json:"dedicated,omitempty"`
}

// summarize returns the summaries of ps.
func summarize(ps []Placement) []nodeSummary {
	var sums []nodeSummary
	for i := range ps {
		sums = addToSummary(sums, &ps[i], 1)
	}
	return sums
}

// addToSummary adds (sign 1) or removes (sign -1) a placement's use, on
// the nodes the placement names, as ledger.charge does. Summaries stay in
// node order; a summary that falls back to zero is dropped.
func addToSummary(sums []nodeSummary, pl *Placement, sign int) []nodeSummary {
	at := func(id int) *nodeSummary {
		i, found := slices.BinarySearchFunc(sums, id, func(s nodeSummary, id int) int { return cmp.Compare(s.Node, id) })
		if !found {
			sums = slices.Insert(sums, i, nodeSummary{Node: id})
		}
		return &sums[i]
	}
	switch pl.Mode {
	case ModeDedicated:
		if len(pl.Nodes) == 0 {
			return sums
		}
		s := at(pl.Nodes[0])
		s.MemoryMiB += int64(sign * pl.MemoryMiB)
		s.VMs += sign
		for _, c := range pl.CPUs {
			i, found := slices.BinarySearch(s.Dedicated, c)
			switch {
			case sign > 0 && !found:
				s.Dedicated = slices.Insert(s.Dedicated, i, c)
			case sign < 0 && found:
				s.Dedicated = slices.Delete(s.Dedicated, i, i+1)
			}
		}
		if len(s.Dedicated) == 0 {
			s.Dedicated = nil
		}
	case ModeNode, "":
		if len(pl.GuestNodes) > 0 {
			for _, g := range pl.GuestNodes {
				s := at(g.HostNode)
				s.VCPUs += sign * len(g.VCPUs)
				s.MemoryMiB += int64(sign * g.MemoryMiB)
				s.VMs += sign
			}
			break
		}
		k := len(pl.Nodes)
		for j, id := range pl.Nodes {
			s := at(id)
			s.VCPUs += sign * share(pl.VCPUs, k, j)
			s.MemoryMiB += int64(sign * share(pl.MemoryMiB, k, j))
			s.VMs += sign
		}
	}
	return slices.DeleteFunc(sums, func(s nodeSummary) bool {
		return s.VCPUs == 0 && s.MemoryMiB == 0 && s.VMs == 0 && len(s.Dedicated) == 0
	})
}
